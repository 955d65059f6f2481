# The refit cost model's constants (tools/lib_cost_model.h) are the ones fitted from measured runs
# in bench/model/fit.json (bench/model/cost_model.py fit, docs/performance.md). This reads that
# file at configure time and generates <build>/generated/tools/cost_model_fit.h, so the C++ model
# (`deltacast probe`'s predictions) can never drift from the fit: a new fit.json re-runs cmake.
# A missing key is a configure error naming it.
set(DELTACAST_COST_MODEL_FIT "${PROJECT_SOURCE_DIR}/bench/model/fit.json" CACHE FILEPATH
    "The fitted cost-model constants (bench/model/cost_model.py fit)")
set_property(DIRECTORY "${PROJECT_SOURCE_DIR}" APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${DELTACAST_COST_MODEL_FIT}")
file(READ "${DELTACAST_COST_MODEL_FIT}" _dc_fit)

function(_dc_fit_get out)
  string(JSON value ERROR_VARIABLE error GET "${_dc_fit}" ${ARGN})
  if(error)
    string(REPLACE ";" "." key "${ARGN}")
    message(FATAL_ERROR "${DELTACAST_COST_MODEL_FIT}: no '${key}' (${error}); re-run bench/model/cost_model.py fit")
  endif()
  set(${out} "${value}" PARENT_SCOPE)
endfunction()

foreach(key t_scan_s_per_byte t_change_s t_apply_c_s t_apply_rc_s t_scan_rc_s_per_byte t_hop_s c0_s k_rtt
            k_rtt_delegated)
  _dc_fit_get(DC_FIT_${key} constants ${key})
endforeach()
foreach(rate 01 03 05)
  _dc_fit_get(DC_FIT_BPC_${rate} bytes_per_change "0.${rate}" median)
endforeach()
configure_file("${PROJECT_SOURCE_DIR}/tools/cost_model_fit.h.in" "${PROJECT_BINARY_DIR}/generated/tools/cost_model_fit.h"
               @ONLY)
unset(_dc_fit)

# Targets that compile tools/lib_cost_model.cpp call this.
function(deltacast_uses_cost_model_fit target)
  target_include_directories(${target} PRIVATE "${PROJECT_BINARY_DIR}/generated")
endfunction()
