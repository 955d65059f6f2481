# deltacast_uninstrumented_host_env(VAR): in a sanitizer build (DELTACAST_SANITIZE), the ctest
# ENVIRONMENT entries a test needs whose process is not instrumented but loads our instrumented
# library (Python, an out-of-tree consumer, the shell scripts that start them): the ASan and UBSan
# runtimes preloaded (ASan must come first in the library list), leak checks off (the interpreter's
# and torch's allocations at exit are not ours; our code's leaks are checked by the C++ tests).
# Empty otherwise.
function(deltacast_uninstrumented_host_env var)
  set(env "")
  if(DELTACAST_SANITIZE)
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libasan.so OUTPUT_VARIABLE asan
                    OUTPUT_STRIP_TRAILING_WHITESPACE)
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libubsan.so OUTPUT_VARIABLE ubsan
                    OUTPUT_STRIP_TRAILING_WHITESPACE)
    set(env "LD_PRELOAD=${asan}:${ubsan}"
      "ASAN_OPTIONS=halt_on_error=1:detect_leaks=0:detect_stack_use_after_return=0:suppressions=${PROJECT_SOURCE_DIR}/tests/sanitizers/asan.supp")
  endif()
  set(${var} "${env}" PARENT_SCOPE)
endfunction()

# deltacast_target_defaults(target): warnings (as errors when DELTACAST_WERROR), sanitizers.
function(deltacast_target_defaults target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align
      -Woverloaded-virtual -Wimplicit-fallthrough>)
  if(DELTACAST_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    # GCC 12 at -O3 warns falsely about `"literal" + std::string` (-Wrestrict, GCC bug 105651),
    # more often in unity batches, where more is inlined.
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict>)
  endif()
  if(CMAKE_UNITY_BUILD)
    # A unity build (CI's Release build: -DCMAKE_UNITY_BUILD=ON) includes each .cpp into a
    # generated one, and GCC then warns about every class of a .cpp with a member whose type is in
    # that .cpp's anonymous namespace (-Wsubobject-linkage: meant for such classes in headers).
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-subobject-linkage>)
  endif()
  if(DELTACAST_SANITIZE)
    # GCC 12's -Wstringop-overflow and -Warray-bounds misfire on std::vector fills under
    # -fsanitize=address (sizes of 2^64 - 4 in stl_algobase.h): off in sanitizer builds only, so
    # -Werror still builds them.
    target_compile_options(${target} PRIVATE -fsanitize=address,undefined -fno-omit-frame-pointer
      $<$<COMPILE_LANGUAGE:CXX>:-Wno-stringop-overflow -Wno-array-bounds>)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
  if(DELTACAST_TSAN)
    # ThreadSanitizer (scripts/tsan.sh): the concurrency tests. Not combinable with ASan.
    target_compile_options(${target} PRIVATE -fsanitize=thread -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=thread)
  endif()
endfunction()
