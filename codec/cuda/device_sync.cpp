#include "codec/cuda/device_sync.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "util/error.h"

namespace deltacast::codec::cuda {

void collect_changes(std::vector<uint64_t>& positions, std::span<const std::byte> mirror, unsigned width,
                     std::vector<uint32_t>& new_bits) {
  if (width != 1 && width != 2 && width != 4)
    throw Error(Errc::invalid_argument, "cuda: unit width must be 1, 2 or 4 bytes");
  std::sort(positions.begin(), positions.end());
  positions.erase(std::unique(positions.begin(), positions.end()), positions.end());
  new_bits.resize(positions.size());
  const uint64_t units = mirror.size() / width;
  for (size_t k = 0; k < positions.size(); ++k) {
    if (positions[k] >= units)
      throw Error(Errc::invalid_argument, "cuda: noted unit " + std::to_string(positions[k]) + " is past the mirror's " +
                                              std::to_string(units) + " units");
    uint32_t b = 0;
    std::memcpy(&b, mirror.data() + positions[k] * width, width);  // little-endian hosts
    new_bits[k] = b;
  }
}

DeviceMirrorSync::DeviceMirrorSync(std::vector<MirroredTensor> tensors, size_t manifest_size)
    : slot_of_(manifest_size, -1) {
  for (auto& t : tensors) {
    if (t.index >= manifest_size) throw Error(Errc::invalid_argument, "cuda: mirrored tensor index past the manifest");
    if (t.mirror.size() != t.device.units * t.device.width)
      throw Error(Errc::invalid_argument, "cuda: a mirror's size differs from its device tensor's");
    slot_of_[t.index] = static_cast<int32_t>(slots_.size());
    slots_.push_back(Slot{t, tensor_digest_seed(t.index), true, {}});
  }
}

void DeviceMirrorSync::note(uint32_t tensor, uint64_t element) {
  if (tensor >= slot_of_.size() || slot_of_[tensor] < 0) return;
  Slot& s = slots_[static_cast<size_t>(slot_of_[tensor])];
  if (!s.whole) s.noted.push_back(element);
}

void DeviceMirrorSync::mark_all_whole() {
  for (auto& s : slots_) {
    s.whole = true;
    s.noted.clear();
  }
}

void DeviceMirrorSync::mark_all_synced() {
  for (auto& s : slots_) {
    s.whole = false;
    s.noted.clear();
  }
}

SyncStats DeviceMirrorSync::sync(const StateDigest& mirror_digest) {
  SyncStats stats;
  std::vector<Slot*> touched;
  for (auto& s : slots_) {
    const auto& t = s.tensor;
    if (s.whole) {
      copy_to_device(t.device.data, t.mirror.data(), t.mirror.size());
      stats.whole_bytes += t.mirror.size();
      touched.push_back(&s);
      continue;
    }
    if (s.noted.empty()) continue;
    collect_changes(s.noted, t.mirror, t.device.width, bits_);
    try {
      scatter_.scatter(t.device, s.noted.data(), bits_.data(), s.noted.size());
    } catch (...) {
      scatter_.rollback();
      for (auto* u : touched) u->whole = true;
      s.whole = true;
      throw;
    }
    stats.scattered += s.noted.size();
    touched.push_back(&s);
  }
  const Slot* bad = nullptr;
  uint64_t bad_device = 0;
  for (auto* s : touched) {
    const uint64_t d = device_tensor_digest(s->tensor.device, s->seed);
    ++stats.tensors_checked;
    if (s->tensor.index >= mirror_digest.per_tensor().size() || d != mirror_digest.per_tensor()[s->tensor.index]) {
      bad = s;
      bad_device = d;
      break;
    }
  }
  if (bad) {
    // Every touched tensor back to its bits before this sync; they are copied whole next time.
    scatter_.rollback();
    for (auto* s : touched) {
      s->whole = true;
      s->noted.clear();
    }
    const uint64_t want =
        bad->tensor.index < mirror_digest.per_tensor().size() ? mirror_digest.per_tensor()[bad->tensor.index] : 0;
    char text[80];
    std::snprintf(text, sizeof text, "device digest %016llx, committed %016llx",
                  static_cast<unsigned long long>(bad_device), static_cast<unsigned long long>(want));
    throw Error(Errc::verify_failed, "cuda: tensor " + std::to_string(bad->tensor.index) +
                                         " in device memory differs from its verified host mirror (" + text +
                                         "); the device tensors were restored and will be copied whole");
  }
  scatter_.commit();
  for (auto* s : touched) {
    s->whole = false;
    s->noted.clear();
  }
  return stats;
}

void DeviceMirrorSync::audit(const StateDigest& mirror_digest) const {
  for (const auto& s : slots_) {
    const uint64_t d = device_tensor_digest(s.tensor.device, s.seed);
    if (s.tensor.index >= mirror_digest.per_tensor().size() || d != mirror_digest.per_tensor()[s.tensor.index])
      throw Error(Errc::verify_failed, "cuda: tensor " + std::to_string(s.tensor.index) +
                                           " in device memory differs from its host mirror");
  }
}

}  // namespace deltacast::codec::cuda
