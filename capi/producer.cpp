// dc_producer_*: a tree::Producer fed from the host's own tensors (deltacast.h). One host thread
// drives it; the calls block (start, refit) while deltacast's threads send.
#include <algorithm>
#include <memory>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "capi/capi_common.h"
#include "codec/cuda/device_diff.h"
#include "codec/cuda/device_mirror.h"
#include "transport/transport.h"
#include "tree/config_options.h"
#include "tree/group_parts.h"
#include "tree/producer.h"
#include "tree/report_json.h"

using namespace deltacast;

struct dc_producer {
  enum class Phase { created, listening, started, finished };
  capi::Options options{"dc_producer_set",
                        {"listen", "receivers", "threads", "group_rank", "group_size", "coordinator", "group_parts"}};
  std::vector<codec::TensorInfo> tensors;
  std::vector<std::span<const std::byte>> data;  // [tensor]: the host's bytes (borrowed)
  std::optional<codec::Manifest> manifest;
  std::unique_ptr<transport::Transport> transport;
  std::unique_ptr<tree::Producer> producer;
  // CUDA tensors (docs/embedding.md, "CUDA buffers"): the producer reads pinned host mirrors that
  // a cuda::DeviceDiffMirror brings up to date before each version (device diff; only the
  // bitmap and the changed values cross PCIe).
  std::vector<void*> cuda_data;            // [tensor]: device pointer, nullptr for host tensors
  std::vector<size_t> mirror_slot;         // [tensor]: index in `mirror`
  int cuda_device = -1;
  std::unique_ptr<codec::cuda::DeviceDiffMirror> mirror;
  Phase phase = Phase::created;
  uint32_t group_size = 1;  // a producer group's M (group_size), set at listen
  std::string url;
  std::string report = "{}";

  const char* phase_name() const {
    static const char* names[] = {"created", "listening", "started", "finished"};
    return names[static_cast<int>(phase)];
  }
  codec::ConstWeights weights() const { return codec::ConstWeights{&*manifest, data}; }
  // The mirrors hold the device tensors' bits now.
  void pull_cuda() {
    if (!mirror) return;
    codec::cuda::use_device(cuda_device);
    mirror->pull();
  }
};

namespace {

void listen(dc_producer& p) {
  if (p.phase != dc_producer::Phase::created) return;
  if (p.tensors.empty()) throw Error(Errc::state, "dc_producer_listen: add the tensors first (dc_producer_add_tensor)");
  config::Config c = p.options.config();  // a copy: clusters: auto resolves into it
  // A producer group's rank (docs/producer-group.md): rank 0 coordinates (receivers say HELLO to
  // it); a rank >= 1 needs the coordinator's URL, and takes the receivers' count from it.
  tree::ProducerGroupOptions group;
  if (const auto size = p.options.process("group_size"))
    group.size = static_cast<uint32_t>(capi::parse_count("group_size", *size, 1, 1024));
  if (const auto rank = p.options.process("group_rank"))
    group.rank = static_cast<uint32_t>(capi::parse_count("group_rank", *rank, 0, 1023));
  group.coordinator_url = p.options.process("coordinator").value_or("");
  const auto receivers = p.options.process("receivers");
  if (!receivers && group.rank == 0)
    throw Error(Errc::config, "set \"receivers\" (how many members start waits for) first");
  const auto count =
      receivers ? static_cast<uint32_t>(capi::parse_count("receivers", *receivers, 1, 1u << 20)) : uint32_t{1};
  capi::resolve_producer_clusters(c, count);
  tree::ProducerOptions options = tree::producer_options_from(c);
  options.receivers = count;
  options.group = group;
  p.group_size = group.size;
  options.listen_url = p.options.process("listen").value_or(c.transport + "://127.0.0.1:0");
  options.encode.threads = p.options.process("threads")
                               ? static_cast<unsigned>(capi::parse_count("threads", *p.options.process("threads"), 1, 1024))
                               : std::max(1u, std::min(4u, std::thread::hardware_concurrency()));
  p.manifest.emplace(p.tensors);
  if (const auto parts = p.options.process("group_parts")) {
    if (group.size < 2) throw Error(Errc::config, "group_parts needs group_size of 2 or more");
    options.group.parts = tree::parse_group_parts(*parts, *p.manifest, group.size);
  }
  std::vector<codec::cuda::DeviceTensor> device;
  p.mirror_slot.assign(p.tensors.size(), SIZE_MAX);
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    if (!p.cuda_data[i]) continue;
    p.mirror_slot[i] = device.size();
    device.push_back({p.cuda_data[i], p.tensors[i].units(),
                      static_cast<unsigned>(codec::dtype_unit_size(p.tensors[i].dtype))});
  }
  if (!device.empty()) {
    codec::cuda::use_device(p.cuda_device);
    p.mirror = std::make_unique<codec::cuda::DeviceDiffMirror>(std::move(device));
    for (size_t i = 0; i < p.tensors.size(); ++i)
      if (p.mirror_slot[i] != SIZE_MAX)
        p.data[i] = std::span<const std::byte>(p.mirror->host(p.mirror_slot[i]), p.tensors[i].nbytes());
  }
  p.transport = transport::make_transport(c.transport, tree::producer_transport_options(c));
  p.producer = std::make_unique<tree::Producer>(*p.transport, *p.manifest, options);
  p.url = p.producer->url();
  p.phase = dc_producer::Phase::listening;
}

// The report of one version as JSON; DC_OK when it committed (or a dry run verified everywhere).
int finish_version(dc_producer& p, const tree::RefitReport& r, bool dry_run) {
  p.report = tree::refit_report_json(r).dump();
  const bool verified = r.receivers > 0 && r.verified_receivers == r.receivers;
  if (r.committed || (dry_run && verified)) return DC_OK;
  return capi::fail(DC_ERR_ABORTED, "version " + std::to_string(r.version) + " was aborted: " + r.abort_reason);
}

}  // namespace

extern "C" {

int dc_producer_create(dc_producer** out) {
  return capi::guarded([&]() -> int {
    capi::require(out, "out");
    *out = nullptr;
    *out = new dc_producer();
    return DC_OK;
  });
}

void dc_producer_free(dc_producer* p) {
  if (!p) return;
  capi::guarded([&]() -> int {
    if (p->producer && p->phase == dc_producer::Phase::started) p->producer->finish();
    return DC_OK;
  });
  delete p;
}

int dc_producer_set(dc_producer* p, const char* key, const char* value) {
  return capi::guarded([&]() -> int {
    capi::require(p, "producer");
    capi::require(key, "key");
    capi::require(value, "value");
    if (p->phase != dc_producer::Phase::created)
      throw Error(Errc::state, std::string("dc_producer_set needs a created producer; this one is ") + p->phase_name());
    p->options.set(key, value);
    return DC_OK;
  });
}

int dc_producer_add_tensor(dc_producer* p, const char* name, int dtype, int ndim, const int64_t* shape,
                           const void* data, size_t nbytes, int device, int device_id) {
  return capi::guarded([&]() -> int {
    capi::require(p, "producer");
    capi::require(name, "name");
    if (p->phase != dc_producer::Phase::created)
      throw Error(Errc::state, std::string("dc_producer_add_tensor after the producer listens (") + p->phase_name() + ")");
    if (device != DC_DEVICE_CUDA) capi::require_host(device, device_id);
    codec::TensorInfo t;
    t.name = name;
    t.dtype = capi::codec_dtype(dtype);
    if (ndim < 0 || (ndim > 0 && !shape)) throw Error(Errc::invalid_argument, "tensor '" + t.name + "': bad ndim/shape");
    for (int i = 0; i < ndim; ++i) {
      if (shape[i] < 0) throw Error(Errc::invalid_argument, "tensor '" + t.name + "': negative dimension");
      t.shape.push_back(static_cast<uint64_t>(shape[i]));
    }
    // A producer group's rank may hold no bytes of a tensor outside its part (data NULL, 0 bytes):
    // its refits read only its part, and refuse a part whose buffer is missing.
    const bool absent = !data && nbytes == 0;
    if (nbytes != t.nbytes() && !absent)
      throw Error(Errc::invalid_argument, "tensor '" + t.name + "' needs " + std::to_string(t.nbytes()) +
                                              " bytes for its shape and dtype; the buffer has " + std::to_string(nbytes));
    if (!data && nbytes > 0) throw Error(Errc::invalid_argument, "tensor '" + t.name + "': data is NULL");
    for (const auto& other : p->tensors)
      if (other.name == t.name) throw Error(Errc::invalid_argument, "tensor '" + t.name + "' was added twice");
    if (device == DC_DEVICE_CUDA) capi::require_cuda_tensor(t, data, device_id, p->cuda_device, "producer");
    p->tensors.push_back(std::move(t));
    p->data.emplace_back(static_cast<const std::byte*>(data), nbytes);
    p->cuda_data.push_back(device == DC_DEVICE_CUDA ? const_cast<void*>(data) : nullptr);
    if (device == DC_DEVICE_CUDA) p->cuda_device = device_id;
    return DC_OK;
  });
}

int dc_producer_listen(dc_producer* p) {
  return capi::guarded([&]() -> int {
    capi::require(p, "producer");
    listen(*p);
    return DC_OK;
  });
}

int dc_producer_url(dc_producer* p, const char** url) {
  return capi::guarded([&]() -> int {
    capi::require(p, "producer");
    capi::require(url, "url");
    listen(*p);
    *url = p->url.c_str();
    return DC_OK;
  });
}

int dc_producer_start(dc_producer* p, int64_t timeout_ms) {
  return capi::guarded([&]() -> int {
    capi::require(p, "producer");
    listen(*p);
    if (p->phase != dc_producer::Phase::listening)
      throw Error(Errc::state, std::string("dc_producer_start on a ") + p->phase_name() + " producer");
    std::optional<std::chrono::milliseconds> timeout;
    if (timeout_ms > 0) timeout = std::chrono::milliseconds(timeout_ms);
    p->producer->start(timeout);
    p->phase = dc_producer::Phase::started;
    p->pull_cuda();
    // Version 1 as RAW pieces (a group: every rank its own part's).
    return finish_version(*p, p->producer->bootstrap(p->weights()), false);
  });
}

int dc_producer_set_data(dc_producer* p, const char* name, const void* data, size_t nbytes) {
  return capi::guarded([&]() -> int {
    capi::require(p, "producer");
    capi::require(name, "name");
    for (size_t i = 0; i < p->tensors.size(); ++i) {
      if (p->tensors[i].name != name) continue;
      if (nbytes != p->tensors[i].nbytes() && !(!data && nbytes == 0 && !p->cuda_data[i]))
        throw Error(Errc::invalid_argument, "tensor '" + p->tensors[i].name + "' needs " +
                                                std::to_string(p->tensors[i].nbytes()) + " bytes; the buffer has " +
                                                std::to_string(nbytes));
      if (!data && nbytes > 0) throw Error(Errc::invalid_argument, std::string("tensor '") + name + "': data is NULL");
      if (p->cuda_data[i]) {
        // A CUDA tensor stays one: the new pointer is device memory, copied whole at the next pull.
        if (nbytes > 0 && !codec::cuda::is_device_pointer(data))
          throw Error(Errc::invalid_argument,
                      std::string("tensor '") + name + "' was added as CUDA memory; the new pointer is not");
        p->cuda_data[i] = const_cast<void*>(data);
        if (p->mirror) p->mirror->set_device(p->mirror_slot[i], const_cast<void*>(data));
        return DC_OK;
      }
      p->data[i] = std::span<const std::byte>(static_cast<const std::byte*>(data), nbytes);
      return DC_OK;
    }
    throw Error(Errc::not_found, std::string("no tensor '") + name + "' in the manifest");
  });
}

int dc_producer_refit(dc_producer* p, int dry_run) {
  return capi::guarded([&]() -> int {
    capi::require(p, "producer");
    if (p->phase != dc_producer::Phase::started)
      throw Error(Errc::state, std::string("dc_producer_refit before dc_producer_start (the producer is ") +
                                   p->phase_name() + ")");
    tree::RefitOptions options;
    options.dry_run = dry_run != 0;
    p->pull_cuda();
    return finish_version(*p, p->producer->refit(p->weights(), options), options.dry_run);
  });
}

int dc_producer_report(const dc_producer* p, const char** json) {
  return capi::guarded([&]() -> int {
    capi::require(p, "producer");
    capi::require(json, "json");
    *json = p->report.c_str();
    return DC_OK;
  });
}

int dc_producer_version(const dc_producer* p, uint64_t* version) {
  return capi::guarded([&]() -> int {
    capi::require(p, "producer");
    capi::require(version, "version");
    *version = p->producer ? p->producer->version() : 0;
    return DC_OK;
  });
}

}  // extern "C"
