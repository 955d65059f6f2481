// The exported dc_* functions of libdeltacast.so: each calls the core's function of the same name
// (capi/shim/core_library.h). When the core cannot be opened, each returns the failure value given
// here (DC_ERR_INTERNAL for a status; dc_last_error() then says why) and frees nothing.
//
// Every line repeats its declaration in include/deltacast/deltacast.h: a definition that differs
// from the declaration does not compile (C linkage allows one signature per name), and
// tests/integration/embed/install_test.sh checks that the shim and the core export the same names.
#include "capi/shim/core_library.h"
#include "deltacast/deltacast.h"

namespace {

template <auto Declared>
auto core_function(const char* name) noexcept {
  // Looked up once per function (a function-local static: thread-safe initialisation).
  return reinterpret_cast<decltype(Declared)>(deltacast::shim::core_symbol(name));
}

}  // namespace

#define DC_FORWARD(ret, name, params, args, on_failure)   \
  extern "C" DC_API ret name params {                     \
    static const auto fn = core_function<&(name)>(#name); \
    if (fn == nullptr) return on_failure;                 \
    return fn args;                                       \
  }

DC_FORWARD(unsigned, dc_version_number, (void), (), DC_VERSION_NUMBER)
DC_FORWARD(const char*, dc_version_string, (void), (), "")
DC_FORWARD(int, dc_is_error, (int status), (status), status < 0 ? 1 : 0)
DC_FORWARD(const char*, dc_status_name, (int status), (status), "DC_ERR_INTERNAL")
DC_FORWARD(const char*, dc_last_error, (void), (), deltacast::shim::core_error())
DC_FORWARD(const char*, dc_dtype_name, (int dtype), (dtype), nullptr)
DC_FORWARD(int, dc_dtype_from_name, (const char* name, int* dtype), (name, dtype), DC_ERR_INTERNAL)
DC_FORWARD(size_t, dc_dtype_size, (int dtype), (dtype), 0)

DC_FORWARD(int, dc_receiver_create, (dc_receiver * *out), (out), DC_ERR_INTERNAL)
DC_FORWARD(void, dc_receiver_free, (dc_receiver * receiver), (receiver), void())
DC_FORWARD(int, dc_receiver_set, (dc_receiver * receiver, const char* key, const char* value), (receiver, key, value),
           DC_ERR_INTERNAL)
DC_FORWARD(int, dc_receiver_join, (dc_receiver * receiver, int64_t timeout_ms), (receiver, timeout_ms), DC_ERR_INTERNAL)
DC_FORWARD(int, dc_receiver_tensor_count, (const dc_receiver* receiver, size_t* count), (receiver, count),
           DC_ERR_INTERNAL)
DC_FORWARD(int, dc_receiver_tensor,
           (const dc_receiver* receiver, size_t index, const char** name, int* dtype, int* ndim, int64_t* shape,
            int shape_capacity),
           (receiver, index, name, dtype, ndim, shape, shape_capacity), DC_ERR_INTERNAL)
DC_FORWARD(int, dc_receiver_attach,
           (dc_receiver * receiver, const char* name, int dtype, int ndim, const int64_t* shape, void* data,
            size_t nbytes, int device, int device_id),
           (receiver, name, dtype, ndim, shape, data, nbytes, device, device_id), DC_ERR_INTERNAL)
DC_FORWARD(int, dc_receiver_place, (dc_receiver * receiver, const char* placement), (receiver, placement),
           DC_ERR_INTERNAL)
DC_FORWARD(int, dc_receiver_start, (dc_receiver * receiver), (receiver), DC_ERR_INTERNAL)
DC_FORWARD(int, dc_receiver_version, (const dc_receiver* receiver, uint64_t* version, uint64_t* digest),
           (receiver, version, digest), DC_ERR_INTERNAL)
DC_FORWARD(int, dc_receiver_wait_version, (dc_receiver * receiver, uint64_t version, int64_t timeout_ms),
           (receiver, version, timeout_ms), DC_ERR_INTERNAL)
DC_FORWARD(int, dc_receiver_pending, (const dc_receiver* receiver, uint64_t* applied_version, size_t* count),
           (receiver, applied_version, count), DC_ERR_INTERNAL)
DC_FORWARD(int, dc_receiver_apply, (dc_receiver * receiver, uint64_t* applied_version), (receiver, applied_version),
           DC_ERR_INTERNAL)
DC_FORWARD(int, dc_receiver_reattach,
           (dc_receiver * receiver, const char* name, void* data, size_t nbytes, int device, int device_id),
           (receiver, name, data, nbytes, device, device_id), DC_ERR_INTERNAL)
DC_FORWARD(int, dc_receiver_set_event_callback, (dc_receiver * receiver, dc_event_callback callback, void* user),
           (receiver, callback, user), DC_ERR_INTERNAL)
DC_FORWARD(int, dc_receiver_poll_event,
           (dc_receiver * receiver, int* kind, uint64_t* version, int* status, const char** message),
           (receiver, kind, version, status, message), DC_ERR_INTERNAL)

DC_FORWARD(int, dc_producer_create, (dc_producer * *out), (out), DC_ERR_INTERNAL)
DC_FORWARD(void, dc_producer_free, (dc_producer * producer), (producer), void())
DC_FORWARD(int, dc_producer_set, (dc_producer * producer, const char* key, const char* value), (producer, key, value),
           DC_ERR_INTERNAL)
DC_FORWARD(int, dc_producer_add_tensor,
           (dc_producer * producer, const char* name, int dtype, int ndim, const int64_t* shape, const void* data,
            size_t nbytes, int device, int device_id),
           (producer, name, dtype, ndim, shape, data, nbytes, device, device_id), DC_ERR_INTERNAL)
DC_FORWARD(int, dc_producer_listen, (dc_producer * producer), (producer), DC_ERR_INTERNAL)
DC_FORWARD(int, dc_producer_url, (dc_producer * producer, const char** url), (producer, url), DC_ERR_INTERNAL)
DC_FORWARD(int, dc_producer_start, (dc_producer * producer, int64_t timeout_ms), (producer, timeout_ms),
           DC_ERR_INTERNAL)
DC_FORWARD(int, dc_producer_set_data, (dc_producer * producer, const char* name, const void* data, size_t nbytes),
           (producer, name, data, nbytes), DC_ERR_INTERNAL)
DC_FORWARD(int, dc_producer_refit, (dc_producer * producer, int dry_run), (producer, dry_run), DC_ERR_INTERNAL)
DC_FORWARD(int, dc_producer_report, (const dc_producer* producer, const char** json), (producer, json), DC_ERR_INTERNAL)
DC_FORWARD(int, dc_producer_version, (const dc_producer* producer, uint64_t* version), (producer, version),
           DC_ERR_INTERNAL)
