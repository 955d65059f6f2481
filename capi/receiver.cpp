// dc_receiver_*: a tree::Receiver serving refits into the host's own buffers on a thread of its
// own (deltacast.h; docs/embedding.md for the life cycle and threading rules).
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "capi/capi_common.h"
#include "codec/cuda/device_diff.h"
#include "codec/cuda/device_sync.h"
#include "codec/placement.h"
#include "config/placement_file.h"
#include "transport/transport.h"
#include "tree/config_options.h"
#include "tree/receiver.h"

using namespace deltacast;

struct dc_receiver {
  enum class Phase { created, joined, started, ended };
  struct Event {
    int kind;
    uint64_t version;
    int status;
    std::string message;
  };
  static constexpr size_t kMaxEvents = 1024;

  capi::Options options{"dc_receiver_set",
                        {"producer", "rank", "listen", "cluster", "gated", "held_version", "held_digest"}};
  uint64_t held_version = 0, held_digest = 0;  // what the server says its buffers hold at join
  std::unique_ptr<transport::Transport> transport;
  std::unique_ptr<tree::Receiver> receiver;
  const codec::Manifest* manifest = nullptr;
  std::vector<std::span<std::byte>> buffers;  // [tensor]: the host's memory, empty until attached
  // A placed receiver (dc_receiver_place): its placement, and its buffers by placement index
  // (`buffers` then stays empty).
  std::vector<codec::BufferPlacement> placement_spec;
  std::optional<codec::Placement> placement;
  std::vector<std::span<std::byte>> placed_buffers;
  std::thread runner;

  mutable std::mutex mutex;  // everything below
  std::condition_variable changed;
  Phase phase = Phase::created;
  uint64_t committed = 0;
  int end_status = DC_OK;  // when ended: DC_OK after BYE or a leave, else the failure
  std::string end_message;
  std::deque<Event> events;
  std::string polled_message;  // the last polled event's message (dc_receiver_poll_event)
  dc_event_callback callback = nullptr;
  void* callback_user = nullptr;

  // CUDA tensors (docs/embedding.md, "CUDA buffers"): each is served through a pinned host mirror
  // that the tree's applier verifies and commits; committed versions reach the device by
  // cuda::DeviceMirrorSync. The tree runs gated whenever a tensor is in CUDA memory, so the
  // mirrors change only inside apply_pending (whose observer notes what to scatter), the
  // bootstrap and snapshots (copied whole).
  struct CudaTensor {
    void* device = nullptr;
    codec::cuda::PinnedBuffer mirror;
  };
  std::vector<std::optional<CudaTensor>> cuda;  // [tensor]
  int cuda_device = -1;
  bool user_gated = false;  // the server asked for the gate itself
  std::unique_ptr<codec::cuda::DeviceMirrorSync> device_sync;
  std::mutex sync_mutex;   // one device sync at a time (the device thread, dc_receiver_apply)
  uint64_t synced_version = 0;  // the version the device tensors hold (with sync_mutex)
  // The device thread: events of the tree, in order, each delivered after the device caught up.
  std::thread device_thread;
  std::deque<Event> device_events;  // with mutex
  bool device_stop = false;         // with mutex
  bool has_cuda() const { return device_sync != nullptr; }

  // Brings the device tensors to what the mirrors hold; `apply_queued`: first write the versions
  // the tree queued into the mirrors (an ungated server). Returns the version the device holds.
  // Throws Error(verify_failed) with the device restored (the next sync copies whole).
  uint64_t sync_device(bool apply_queued) {
    std::lock_guard lock(sync_mutex);
    codec::cuda::use_device(cuda_device);
    if (receiver->applied_version() != synced_version) device_sync->mark_all_whole();
    if (apply_queued)
      receiver->apply_pending([this](uint32_t tensor, uint64_t element, uint32_t) { device_sync->note(tensor, element); });
    const uint64_t version = receiver->applied_version();
    try {
      device_sync->sync(receiver->applied_state_digest());
    } catch (const Error& e) {
      if (e.code() != Errc::verify_failed) throw;
      // Once more from the mirrors, whole (a concurrent snapshot, or a device fault).
      device_sync->sync(receiver->applied_state_digest());
    }
    synced_version = version;
    return version;
  }

  void run_device_thread() {
    for (;;) {
      Event e;
      {
        std::unique_lock lock(mutex);
        changed.wait(lock, [&] { return device_stop || !device_events.empty(); });
        if (device_events.empty()) return;
        e = std::move(device_events.front());
        device_events.pop_front();
      }
      if (e.kind == DC_EVENT_COMMITTED) {
        try {
          sync_device(!user_gated);
        } catch (const std::exception& failure) {
          const int status = [&] {
            if (auto* err = dynamic_cast<const Error*>(&failure)) return capi::status_of(err->code());
            return static_cast<int>(DC_ERR_INTERNAL);
          }();
          emit(DC_EVENT_FAILED, e.version, status, std::string("CUDA tensors: ") + failure.what());
          receiver->stop();
          return;
        }
      }
      emit(e.kind, e.version, e.status, std::move(e.message));
    }
  }
  // From the tree's threads: queued for the device thread when CUDA tensors are attached.
  void tree_event(int kind, uint64_t version, int status, std::string message) {
    if (!has_cuda()) return emit(kind, version, status, std::move(message));
    {
      std::lock_guard lock(mutex);
      device_events.push_back({kind, version, status, std::move(message)});
    }
    changed.notify_all();
  }

  // Queues an event and calls the callback (outside the lock). `ending`: the receiver stopped
  // with `status`; the phase changes under the same lock, so a waiter woken by the end sees the
  // event already queued.
  void emit(int kind, uint64_t version, int status, std::string message, bool ending = false) {
    dc_event_callback cb;
    void* user;
    {
      std::lock_guard lock(mutex);
      if (kind == DC_EVENT_COMMITTED) committed = std::max(committed, version);
      if (ending) {
        phase = Phase::ended;
        end_status = status;
        end_message = message;
      }
      if (events.size() == kMaxEvents) events.pop_front();
      events.push_back({kind, version, status, message});
      cb = callback;
      user = callback_user;
    }
    changed.notify_all();
    if (cb) cb(user, kind, version, status, message.c_str());
  }

  void require_phase(Phase want, const char* call) const {
    std::lock_guard lock(mutex);
    if (phase == want) return;
    static const char* names[] = {"created", "joined", "started", "ended"};
    throw Error(Errc::state, std::string(call) + " needs a " + names[static_cast<int>(want)] +
                                 " receiver; this one is " + names[static_cast<int>(phase)]);
  }
};

namespace {

// The manifest's index of `name`, or Error(not_found).
uint32_t tensor_index(const codec::Manifest& manifest, const char* name) {
  capi::require(name, "name");
  auto index = manifest.find(name);
  if (!index) throw Error(Errc::not_found, std::string("no tensor '") + name + "' in the producer's manifest");
  return *index;
}

void check_described(const codec::TensorInfo& t, int dtype, int ndim, const int64_t* shape, size_t nbytes) {
  const codec::DType d = capi::codec_dtype(dtype);
  if (d != t.dtype)
    throw Error(Errc::invalid_argument, "tensor '" + t.name + "' is " + std::string(codec::dtype_name(t.dtype)) +
                                            " in the manifest, not " + dc_dtype_name(dtype));
  bool same = ndim >= 0 && static_cast<size_t>(ndim) == t.shape.size() && (ndim == 0 || shape);
  for (int i = 0; same && i < ndim; ++i) same = shape[i] >= 0 && static_cast<uint64_t>(shape[i]) == t.shape[i];
  if (!same) {
    std::string want = "[";
    for (size_t i = 0; i < t.shape.size(); ++i) want += (i ? ", " : "") + std::to_string(t.shape[i]);
    throw Error(Errc::invalid_argument, "tensor '" + t.name + "' has shape " + want + "] in the manifest; the buffer's shape differs");
  }
  if (nbytes != t.nbytes())
    throw Error(Errc::invalid_argument, "tensor '" + t.name + "' needs " + std::to_string(t.nbytes()) +
                                            " bytes; the buffer has " + std::to_string(nbytes));
}

int start_running(dc_receiver* r);

// dc_receiver_attach of a placed receiver: `name` is one of its placement's buffers.
int attach_placed_buffer(dc_receiver& r, const char* name, int dtype, int ndim, const int64_t* shape, void* data,
                         size_t nbytes, int device, int device_id) {
  capi::require(name, "name");
  const auto& p = *r.placement;
  uint32_t b = 0;
  while (b < p.buffers().size() && p.buffers()[b].name != name) ++b;
  if (b == p.buffers().size())
    throw Error(Errc::not_found, std::string("no buffer '") + name + "' in this receiver's placement");
  if (device == DC_DEVICE_CUDA)
    throw Error(Errc::unsupported, std::string("buffer '") + name + "': placed CUDA buffers are not built");
  capi::require_host(device, device_id);
  if (capi::codec_dtype(dtype) != p.dtype(b))
    throw Error(Errc::invalid_argument, std::string("buffer '") + name + "' is " +
                                            std::string(codec::dtype_name(p.dtype(b))) + " in the placement, not " +
                                            dc_dtype_name(dtype));
  const auto& want = p.shape(b);
  bool same = ndim >= 0 && static_cast<size_t>(ndim) == want.size() && (ndim == 0 || shape);
  for (int i = 0; same && i < ndim; ++i) same = shape[i] >= 0 && static_cast<uint64_t>(shape[i]) == want[i];
  if (!same) {
    std::string text = "[";
    for (size_t i = 0; i < want.size(); ++i) text += (i ? ", " : "") + std::to_string(want[i]);
    throw Error(Errc::invalid_argument, std::string("buffer '") + name + "' has shape " + text +
                                            "] in the placement; the buffer's shape differs");
  }
  const uint64_t bytes = p.buffer_units(b) * codec::dtype_unit_size(p.dtype(b));
  if (nbytes != bytes)
    throw Error(Errc::invalid_argument, std::string("buffer '") + name + "' needs " + std::to_string(bytes) +
                                            " bytes; the buffer has " + std::to_string(nbytes));
  if (!data && nbytes > 0) throw Error(Errc::invalid_argument, std::string("buffer '") + name + "': data is NULL");
  r.placed_buffers[b] = std::span<std::byte>(static_cast<std::byte*>(data), nbytes);
  return DC_OK;
}

}  // namespace

extern "C" {

int dc_receiver_create(dc_receiver** out) {
  return capi::guarded([&]() -> int {
    capi::require(out, "out");
    *out = nullptr;
    *out = new dc_receiver();
    return DC_OK;
  });
}

void dc_receiver_free(dc_receiver* r) {
  if (!r) return;
  capi::guarded([&]() -> int {
    if (r->receiver) r->receiver->stop();
    if (r->runner.joinable()) r->runner.join();
    if (r->device_thread.joinable()) {
      {
        std::lock_guard lock(r->mutex);
        r->device_stop = true;
      }
      r->changed.notify_all();
      r->device_thread.join();
    }
    return DC_OK;
  });
  delete r;
}

int dc_receiver_set(dc_receiver* r, const char* key, const char* value) {
  return capi::guarded([&]() -> int {
    capi::require(r, "receiver");
    capi::require(key, "key");
    capi::require(value, "value");
    r->require_phase(dc_receiver::Phase::created, "dc_receiver_set");
    // Refused now, not at join.
    if (std::string_view(key) == "gated") capi::parse_bool(key, value);
    if (std::string_view(key) == "held_version") capi::parse_count(key, value, 0, UINT64_MAX);
    if (std::string_view(key) == "held_digest") capi::parse_digest(key, value);
    r->options.set(key, value);
    return DC_OK;
  });
}

int dc_receiver_join(dc_receiver* r, int64_t timeout_ms) {
  return capi::guarded([&]() -> int {
    capi::require(r, "receiver");
    r->require_phase(dc_receiver::Phase::created, "dc_receiver_join");
    const config::Config& c = r->options.config();
    const auto producer = r->options.process("producer");
    const auto rank = r->options.process("rank");
    if (!producer || producer->empty()) throw Error(Errc::config, "dc_receiver_join: set \"producer\" (the rendezvous URL) first");
    if (!rank) throw Error(Errc::config, "dc_receiver_join: set \"rank\" (1..N) first");
    tree::ReceiverOptions options = tree::receiver_options_from(c);
    options.rank = static_cast<uint32_t>(capi::parse_count("rank (0 is the producer)", *rank, 1, 0xffffffffu));
    options.producer_url = *producer;
    options.listen_url = r->options.process("listen").value_or(c.transport + "://127.0.0.1:0");
    options.cluster = capi::receiver_cluster(c, options.rank, r->options.process("cluster"));
    options.gated = capi::parse_bool("gated", r->options.process("gated").value_or("false"));
    if (timeout_ms > 0) options.join_timeout = std::chrono::milliseconds(timeout_ms);
    options.on_active = [r](uint64_t version) { r->tree_event(DC_EVENT_COMMITTED, version, DC_OK, ""); };
    options.on_aborted = [r](uint64_t version) {
      r->tree_event(DC_EVENT_ROLLED_BACK, version, DC_ERR_ABORTED, "version " + std::to_string(version) + " was aborted");
    };
    r->user_gated = options.gated;
    if (!r->transport)
      r->transport =
          transport::make_transport(c.transport, tree::member_transport_options(c, static_cast<int>(options.rank) - 1));
    r->held_version = capi::parse_count("held_version", r->options.process("held_version").value_or("0"), 0, UINT64_MAX);
    const auto held_digest = r->options.process("held_digest");
    if (r->held_version > 0 && !held_digest)
      throw Error(Errc::config, "held_version " + std::to_string(r->held_version) +
                                    " needs held_digest (the digest dc_receiver_version gave for that version)");
    r->held_digest = held_digest ? capi::parse_digest("held_digest", *held_digest) : 0;
    r->receiver = std::make_unique<tree::Receiver>(*r->transport, options);
    r->manifest = &r->receiver->join(r->held_version, r->held_digest);
    r->buffers.assign(r->manifest->size(), {});
    r->cuda.clear();
    r->cuda.resize(r->manifest->size());
    std::lock_guard lock(r->mutex);
    r->phase = dc_receiver::Phase::joined;
    return DC_OK;
  });
}

int dc_receiver_tensor_count(const dc_receiver* r, size_t* count) {
  return capi::guarded([&]() -> int {
    capi::require(r, "receiver");
    capi::require(count, "count");
    if (!r->manifest) throw Error(Errc::state, "dc_receiver_tensor_count before dc_receiver_join");
    *count = r->manifest->size();
    return DC_OK;
  });
}

int dc_receiver_tensor(const dc_receiver* r, size_t index, const char** name, int* dtype, int* ndim, int64_t* shape,
                       int shape_capacity) {
  return capi::guarded([&]() -> int {
    capi::require(r, "receiver");
    if (!r->manifest) throw Error(Errc::state, "dc_receiver_tensor before dc_receiver_join");
    if (index >= r->manifest->size())
      throw Error(Errc::not_found, "tensor index " + std::to_string(index) + " is past the manifest's " +
                                       std::to_string(r->manifest->size()) + " tensors");
    const auto& t = r->manifest->tensors()[index];
    if (name) *name = t.name.c_str();
    if (dtype) *dtype = capi::dc_dtype_of(t.dtype);
    if (ndim) *ndim = static_cast<int>(t.shape.size());
    if (shape)
      for (size_t i = 0; i < t.shape.size() && static_cast<int>(i) < shape_capacity; ++i)
        shape[i] = static_cast<int64_t>(t.shape[i]);
    return DC_OK;
  });
}

int dc_receiver_attach(dc_receiver* r, const char* name, int dtype, int ndim, const int64_t* shape, void* data,
                       size_t nbytes, int device, int device_id) {
  return capi::guarded([&]() -> int {
    capi::require(r, "receiver");
    r->require_phase(dc_receiver::Phase::joined, "dc_receiver_attach");
    if (r->placement) return attach_placed_buffer(*r, name, dtype, ndim, shape, data, nbytes, device, device_id);
    const uint32_t index = tensor_index(*r->manifest, name);
    const auto& t = r->manifest->tensors()[index];
    if (device != DC_DEVICE_CUDA) capi::require_host(device, device_id);
    check_described(t, dtype, ndim, shape, nbytes);
    if (!data && nbytes > 0) throw Error(Errc::invalid_argument, "tensor '" + t.name + "': data is NULL");
    if (device == DC_DEVICE_CUDA) {
      capi::require_cuda_tensor(t, data, device_id, r->cuda_device, "receiver");
      dc_receiver::CudaTensor c;
      c.device = data;
      c.mirror.reserve(nbytes ? nbytes : 1);  // pinned, zero-filled: version 0
      r->buffers[index] = std::span<std::byte>(c.mirror.data(), nbytes);
      r->cuda[index] = std::move(c);
      r->cuda_device = device_id;
      return DC_OK;
    }
    r->buffers[index] = std::span<std::byte>(static_cast<std::byte*>(data), nbytes);
    r->cuda[index].reset();
    return DC_OK;
  });
}

int dc_receiver_start(dc_receiver* r) {
  return capi::guarded([&]() -> int {
    capi::require(r, "receiver");
    r->require_phase(dc_receiver::Phase::joined, "dc_receiver_start");
    if (r->placement) {
      std::string missing;
      for (size_t b = 0; b < r->placed_buffers.size(); ++b)
        if (r->placed_buffers[b].data() == nullptr && r->placement->buffer_units(static_cast<uint32_t>(b)) > 0)
          missing += (missing.empty() ? "'" : ", '") + r->placement->buffers()[b].name + "'";
      if (!missing.empty()) throw Error(Errc::state, "dc_receiver_start: placement buffers not attached: " + missing);
      // A restarted server's held version is checked by the next seal's slice table.
      r->receiver->attach_placed(r->placement_spec, r->placed_buffers, r->held_version, r->held_digest);
      return start_running(r);
    }
    std::string missing;
    size_t n_missing = 0;
    for (size_t i = 0; i < r->buffers.size(); ++i)
      if (r->buffers[i].data() == nullptr && r->manifest->tensors()[i].nbytes() > 0) {
        if (n_missing++ < 5) missing += (missing.empty() ? "'" : ", '") + r->manifest->tensors()[i].name + "'";
      }
    if (n_missing > 0)
      throw Error(Errc::state, "dc_receiver_start: " + std::to_string(n_missing) + " tensors are not attached (" +
                                   missing + (n_missing > 5 ? ", ..." : "") + ")");
    codec::MutableWeights weights{r->manifest, r->buffers};
    std::vector<codec::cuda::MirroredTensor> mirrored;
    for (uint32_t i = 0; i < r->cuda.size(); ++i) {
      if (!r->cuda[i]) continue;
      const auto& t = r->manifest->at(i);
      const auto w = static_cast<unsigned>(codec::dtype_unit_size(t.dtype));
      mirrored.push_back({i, codec::cuda::DeviceTensor{r->cuda[i]->device, t.units(), w}, r->buffers[i]});
    }
    if (!mirrored.empty()) {
      codec::cuda::use_device(r->cuda_device);
      r->device_sync = std::make_unique<codec::cuda::DeviceMirrorSync>(std::move(mirrored), r->manifest->size());
      r->receiver->set_gated(true);  // the mirrors change only where the device sync sees it
      if (r->held_version > 0) {
        // The server kept its weights on the device: the mirrors start as copies of them.
        for (uint32_t i = 0; i < r->cuda.size(); ++i)
          if (r->cuda[i]) codec::cuda::copy_to_host(r->buffers[i].data(), r->cuda[i]->device, r->buffers[i].size());
        r->device_sync->mark_all_synced();
        r->synced_version = r->held_version;
      }
    }
    if (r->held_version == 0) {
      // A fresh member holds version 0; the bootstrap (or a snapshot) overwrites every byte, so
      // what the buffers hold now does not matter.
      r->receiver->attach(weights, 0);
    } else {
      // A restarted server offering the version it kept: its buffers must hold exactly that.
      auto digest = codec::StateDigest::full_scan(weights.as_const(), 0);
      if (digest.combined() != r->held_digest)
        throw Error(Errc::verify_failed, "the attached buffers do not hold version " + std::to_string(r->held_version) +
                                             " (their digest differs from held_digest); nothing was written");
      r->receiver->attach(weights, r->held_version, std::move(digest));
    }
    return start_running(r);
  });
}

}  // extern "C"

namespace {

// The last step of dc_receiver_start: the receiver is attached; its threads start.
int start_running(dc_receiver* r) {
  {
    std::lock_guard lock(r->mutex);
    r->phase = dc_receiver::Phase::started;
  }
  if (r->has_cuda()) r->device_thread = std::thread([r] { r->run_device_thread(); });
  r->runner = std::thread([r] {
    int status = DC_OK;
    std::string message;
    try {
      const tree::RunSummary summary = r->receiver->run();
      message = "ended at version " + std::to_string(summary.version);
    } catch (const Error& e) {
      status = capi::status_of(e.code());
      message = e.what();
    } catch (const std::exception& e) {
      status = DC_ERR_INTERNAL;
      message = e.what();
    }
    r->emit(status == DC_OK ? DC_EVENT_ENDED : DC_EVENT_FAILED, r->receiver->version(), status, message, true);
  });
  return DC_OK;
}

}  // namespace

extern "C" {

int dc_receiver_place(dc_receiver* r, const char* placement) {
  return capi::guarded([&]() -> int {
    capi::require(r, "receiver");
    capi::require(placement, "placement");
    r->require_phase(dc_receiver::Phase::joined, "dc_receiver_place");
    for (const auto& b : r->buffers)
      if (b.data() != nullptr) throw Error(Errc::state, "dc_receiver_place after a tensor was attached whole");
    auto spec = config::parse_placement(placement, "placement");
    auto compiled = codec::Placement::compile(*r->manifest, spec);  // a refusal keeps the current one
    r->placement.emplace(std::move(compiled));
    r->placement_spec = std::move(spec);
    r->placed_buffers.assign(r->placement->buffers().size(), {});
    return DC_OK;
  });
}

int dc_receiver_version(const dc_receiver* r, uint64_t* version, uint64_t* digest) {
  return capi::guarded([&]() -> int {
    capi::require(r, "receiver");
    if (version) *version = r->receiver ? r->receiver->version() : 0;
    if (digest) *digest = r->receiver ? r->receiver->digest() : 0;
    return DC_OK;
  });
}

int dc_receiver_wait_version(dc_receiver* r, uint64_t version, int64_t timeout_ms) {
  return capi::guarded([&]() -> int {
    capi::require(r, "receiver");
    std::unique_lock lock(r->mutex);
    if (r->phase == dc_receiver::Phase::created || r->phase == dc_receiver::Phase::joined)
      throw Error(Errc::state, "dc_receiver_wait_version before dc_receiver_start");
    auto done = [&] { return r->committed >= version || r->phase == dc_receiver::Phase::ended; };
    if (timeout_ms < 0)
      r->changed.wait(lock, done);
    else if (!r->changed.wait_for(lock, std::chrono::milliseconds(timeout_ms), done))
      throw Error(Errc::timeout, "version " + std::to_string(version) + " was not committed within " +
                                     std::to_string(timeout_ms) + " ms (committed: " + std::to_string(r->committed) + ")");
    if (r->committed >= version) return DC_OK;
    if (r->end_status != DC_OK) return capi::fail(r->end_status, r->end_message);
    throw Error(Errc::state, "the receiver ended at version " + std::to_string(r->committed) + " before version " +
                                 std::to_string(version) + " (" + r->end_message + ")");
  });
}

int dc_receiver_pending(const dc_receiver* r, uint64_t* applied_version, size_t* count) {
  return capi::guarded([&]() -> int {
    capi::require(r, "receiver");
    uint64_t applied = 0;
    size_t n = 0;
    if (r->receiver) {
      applied = r->receiver->version();
      const std::vector<uint64_t> pending = r->receiver->pending();  // consecutive versions
      if (!pending.empty()) {
        applied = pending.front() - 1;
        n = pending.size();
      }
    }
    if (applied_version) *applied_version = applied;
    if (count) *count = n;
    return DC_OK;
  });
}

int dc_receiver_apply(dc_receiver* r, uint64_t* applied_version) {
  return capi::guarded([&]() -> int {
    capi::require(r, "receiver");
    {
      std::lock_guard lock(r->mutex);
      if (r->phase == dc_receiver::Phase::created || r->phase == dc_receiver::Phase::joined)
        throw Error(Errc::state, "dc_receiver_apply before dc_receiver_start");
    }
    const uint64_t applied = r->has_cuda() ? r->sync_device(r->user_gated) : r->receiver->apply_pending();
    if (applied_version) *applied_version = applied;
    return DC_OK;
  });
}

int dc_receiver_reattach(dc_receiver* r, const char* name, void* data, size_t nbytes, int device, int device_id) {
  return capi::guarded([&]() -> int {
    capi::require(r, "receiver");
    {
      std::lock_guard lock(r->mutex);
      if (r->phase != dc_receiver::Phase::started)
        throw Error(Errc::state, "dc_receiver_reattach needs a started receiver (before start, use dc_receiver_attach)");
    }
    const uint32_t index = tensor_index(*r->manifest, name);
    const auto& t = r->manifest->tensors()[index];
    if (device == DC_DEVICE_CUDA || r->cuda[index])
      throw Error(Errc::unsupported, "tensor '" + t.name + "': re-registering CUDA tensors is not built "
                                     "(docs/embedding.md, \"CUDA buffers\")");
    capi::require_host(device, device_id);
    if (nbytes != t.nbytes())
      throw Error(Errc::invalid_argument, "tensor '" + t.name + "' needs " + std::to_string(t.nbytes()) +
                                              " bytes; the new buffer has " + std::to_string(nbytes));
    if (!data && nbytes > 0) throw Error(Errc::invalid_argument, "tensor '" + t.name + "': data is NULL");
    const std::span<std::byte> memory(static_cast<std::byte*>(data), nbytes);
    r->receiver->reattach(index, memory);
    r->buffers[index] = memory;
    return DC_OK;
  });
}

int dc_receiver_set_event_callback(dc_receiver* r, dc_event_callback callback, void* user) {
  return capi::guarded([&]() -> int {
    capi::require(r, "receiver");
    std::lock_guard lock(r->mutex);
    if (r->phase == dc_receiver::Phase::started)
      throw Error(Errc::state, "dc_receiver_set_event_callback after dc_receiver_start");
    r->callback = callback;
    r->callback_user = user;
    return DC_OK;
  });
}

int dc_receiver_poll_event(dc_receiver* r, int* kind, uint64_t* version, int* status, const char** message) {
  return capi::guarded([&]() -> int {
    capi::require(r, "receiver");
    std::lock_guard lock(r->mutex);
    if (r->events.empty()) return DC_PENDING;
    auto& e = r->events.front();
    if (kind) *kind = e.kind;
    if (version) *version = e.version;
    if (status) *status = e.status;
    r->polled_message = std::move(e.message);
    if (message) *message = r->polled_message.c_str();
    r->events.pop_front();
    return DC_OK;
  });
}

}  // extern "C"
