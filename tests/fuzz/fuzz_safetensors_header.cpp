// fuzz_safetensors_header: checkpoints as users keep them (checkpoint/safetensors.h,
// checkpoint/checkpoint.h), written to a private directory on tmpfs (the readers take paths).
//
// Input: byte 0 = mode, then
//   mode bit 0 = 0: one .safetensors file (the rest of the input);
//   mode bit 0 = 1: a sharded directory: the rest split at "\n#SHARD#\n" into
//     model.safetensors.index.json and up to 4 shards model-0000K-of-0000N.safetensors (N pieces
//     after the index); mode bit 1 drops the index (a directory of shards alone).
// Oracles:
//   * opening throws nothing but Error(invalid_argument) (malformed) or, for a directory,
//     Error(not_found) (a missing shard);
//   * a file that opens: its tensors tile the data region after the header exactly, in manifest
//     order (in bounds, no overlap, no gap), and each tensor's bytes are the file's bytes there;
//   * a checkpoint that opens: its manifest is sorted by name, each tensor holds the bytes its
//     shard file holds for that name; write_checkpoint in its layout and opening the result gives
//     the same manifest, the same bytes and the same layout (shards, tensor order, metadata).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "codec/owned_weights.h"
#include "fuzz_common.h"
#include "util/error.h"

namespace deltacast::fuzz {
namespace {

namespace fs = std::filesystem;
using checkpoint::Checkpoint;
using checkpoint::SafetensorsFile;

constexpr std::string_view kSeparator = "\n#SHARD#\n";
constexpr size_t kMaxShards = 4;

// A directory of this process on tmpfs, emptied for each input.
fs::path work_dir() {
  static const fs::path dir = [] {
    const fs::path root = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    return root / ("deltacast-fuzz-safetensors-" + std::to_string(getpid()));
  }();
  fs::remove_all(dir);
  fs::create_directories(dir / "in");
  return dir;
}

void write(const fs::path& path, std::string_view bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string shard_name(size_t k, size_t n) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k, n);
  return name;
}

// The file's tensors tile [8 + header length, size) in manifest order, holding the file's bytes.
void check_file(const SafetensorsFile& file, std::string_view bytes) {
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
  const uint64_t data_start = 8 + header_len;
  FUZZ_CHECK(file.file_size() == bytes.size() && data_start <= bytes.size(), "accepted a header past the file end");
  const auto weights = file.weights();
  FUZZ_CHECK(weights.tensors.size() == file.manifest().size(), "one span per tensor");
  const std::byte* base = nullptr;  // where the mapping's data region starts
  uint64_t offset = data_start;
  for (size_t i = 0; i < weights.tensors.size(); ++i) {
    const auto span = weights.tensors[i];
    FUZZ_CHECK(span.size() == file.manifest().tensors()[i].nbytes(), "a tensor's span is not its size");
    if (span.empty()) continue;
    if (base == nullptr) base = span.data() - offset;
    FUZZ_CHECK(span.data() == base + offset, "tensors do not tile the data region in manifest order");
    FUZZ_CHECK(offset + span.size() <= bytes.size(), "a tensor past the end of the file");
    FUZZ_CHECK(same_bytes(span, std::as_bytes(std::span(bytes.substr(offset, span.size())))),
               "a tensor's bytes are not the file's bytes at its offsets");
    offset += span.size();
  }
  FUZZ_CHECK(offset == bytes.size(), "tensors leave part of the data region uncovered");
}

bool same_layout(const checkpoint::Layout& a, const checkpoint::Layout& b, bool compare_files) {
  if (a.sharded != b.sharded || a.shards.size() != b.shards.size()) return false;
  for (size_t i = 0; i < a.shards.size(); ++i) {
    if (compare_files && a.shards[i].file != b.shards[i].file) return false;
    if (a.shards[i].tensors != b.shards[i].tensors || a.shards[i].metadata != b.shards[i].metadata) return false;
  }
  return true;
}

void check_checkpoint(const Checkpoint& ckpt, const fs::path& dir) {
  const auto& tensors = ckpt.manifest().tensors();
  for (size_t i = 1; i < tensors.size(); ++i)
    FUZZ_CHECK(tensors[i - 1].name < tensors[i].name, "the checkpoint's manifest is not sorted by name");
  const auto weights = ckpt.weights();
  for (uint32_t i = 0; i < tensors.size(); ++i) {
    const fs::path shard = ckpt.layout().sharded ? dir / ckpt.file_of(i) : ckpt.path();
    const auto file = SafetensorsFile::open(shard);
    const auto at = file.manifest().find(tensors[i].name);
    FUZZ_CHECK(at.has_value(), "a tensor is not in the shard the checkpoint names");
    FUZZ_CHECK(same_bytes(weights.tensors[i], file.weights().tensors[*at]), "a tensor's bytes differ from its shard's");
  }
  // Round trip: write in the same layout, read back.
  const fs::path out = dir.parent_path() / "out" / (ckpt.layout().sharded ? "ckpt" : "model.safetensors");
  fs::create_directories(out.parent_path());
  checkpoint::write_checkpoint(out, weights, ckpt.layout());
  const auto again = Checkpoint::open(out);
  FUZZ_CHECK(again.manifest().digest() == ckpt.manifest().digest(), "the written checkpoint has another manifest");
  FUZZ_CHECK(codec::bitwise_equal(again.weights(), weights), "the written checkpoint has other bytes");
  FUZZ_CHECK(same_layout(again.layout(), ckpt.layout(), ckpt.layout().sharded), "the written checkpoint has another layout");
}

void run(unsigned mode, std::string_view rest) {
  const fs::path dir = work_dir() / "in";
  fs::path target;
  if ((mode & 1) == 0) {
    target = dir / "model.safetensors";
    write(target, rest);
    std::optional<SafetensorsFile> file;
    try {
      file.emplace(SafetensorsFile::open(target));
    } catch (const Error& e) {
      FUZZ_CHECK(e.code() == Errc::invalid_argument, std::string("SafetensorsFile::open threw ") + e.what());
    }
    if (file) check_file(*file, rest);
  } else {
    std::vector<std::string_view> pieces;
    for (size_t at = 0;;) {
      const size_t next = rest.find(kSeparator, at);
      if (next == std::string_view::npos || pieces.size() == kMaxShards) {
        pieces.push_back(rest.substr(at));
        break;
      }
      pieces.push_back(rest.substr(at, next - at));
      at = next + kSeparator.size();
    }
    if ((mode & 2) == 0) write(dir / checkpoint::kIndexFileName, pieces[0]);
    for (size_t k = 1; k < pieces.size(); ++k) write(dir / shard_name(k, pieces.size() - 1), pieces[k]);
    target = dir;
  }
  std::optional<Checkpoint> ckpt;
  try {
    ckpt.emplace(Checkpoint::open(target));
  } catch (const Error& e) {
    FUZZ_CHECK(e.code() == Errc::invalid_argument || ((mode & 1) && e.code() == Errc::not_found),
               std::string("Checkpoint::open threw ") + std::string(errc_name(e.code())) + ": " + e.what());
    return;
  }
  check_checkpoint(*ckpt, dir);  // an Error from here on (the round trip) is a crash
}

}  // namespace
}  // namespace deltacast::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  deltacast::fuzz::run(data[0], std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  return 0;
}
