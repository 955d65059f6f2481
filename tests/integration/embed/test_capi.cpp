// The C API (include/deltacast/deltacast.h) end to end through libdeltacast.so: a producer and
// receivers in this process, each with its own handle, over tcp on 127.0.0.1. Every applied
// version is compared bit for bit (bytewise ==) with the producer's tensors; refusals must leave the
// registered buffers byte-identical.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <set>
#include <thread>
#include <vector>

#include "deltacast/deltacast.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

extern char** environ;

namespace {

#define DC_EXPECT_OK(call)                                                           \
  do {                                                                               \
    const int dc_status_ = (call);                                                   \
    ASSERT_EQ(dc_status_, DC_OK) << dc_status_name(dc_status_) << ": " << dc_last_error(); \
  } while (0)

uint16_t bf16_of(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>(bits >> 16);
}

// A small model: BF16 matrices (odd sizes), an F32 vector, an F16 scalar-ish tensor, an I8 and a
// U8 tensor, one 0-dim tensor and one empty tensor.
struct Model {
  struct Tensor {
    std::string name;
    int dtype;
    std::vector<int64_t> shape;
    std::vector<std::byte> bytes;
  };
  std::vector<Tensor> tensors;

  Model() {
    add("layers.0.weight", DC_DTYPE_BF16, {257, 129});
    add("layers.0.bias", DC_DTYPE_BF16, {257});
    add("layers.1.weight", DC_DTYPE_BF16, {33, 1031});
    add("norm.scale", DC_DTYPE_F32, {1031});
    add("head.f16", DC_DTYPE_F16, {3, 5, 7});
    add("codes.i8", DC_DTYPE_I8, {999});
    add("mask.u8", DC_DTYPE_U8, {17});
    add("temperature", DC_DTYPE_F32, {});
    add("empty", DC_DTYPE_BF16, {0, 4});
    std::mt19937 rng(7);
    for (auto& t : tensors)
      for (auto& b : t.bytes) b = static_cast<std::byte>(rng());
  }
  void add(std::string name, int dtype, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    tensors.push_back({std::move(name), dtype, std::move(shape),
                       std::vector<std::byte>(static_cast<size_t>(n) * dc_dtype_size(dtype))});
  }
  // Changes ~frac of the bytes of every tensor; step 2 also writes NaN, +-inf, -0.0 and a
  // subnormal into the BF16 and F32 tensors.
  void step(int k, double frac) {
    std::mt19937 rng(100 + k);
    for (auto& t : tensors) {
      if (t.bytes.empty()) continue;
      std::uniform_int_distribution<size_t> at(0, t.bytes.size() - 1);
      const size_t n = std::max<size_t>(1, static_cast<size_t>(frac * static_cast<double>(t.bytes.size())));
      for (size_t i = 0; i < n; ++i) t.bytes[at(rng)] ^= static_cast<std::byte>(1 + rng() % 255);
    }
    if (k == 2) {
      const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity(), -0.0f,
                                std::numeric_limits<float>::denorm_min()};
      auto& w = tensors[0].bytes;
      auto& v = tensors[3].bytes;
      for (size_t i = 0; i < 5; ++i) {
        const uint16_t b = bf16_of(specials[i]);
        std::memcpy(w.data() + 2 * (11 * i + 3), &b, 2);
        std::memcpy(v.data() + 4 * (13 * i + 1), &specials[i], 4);
      }
    }
  }
};

struct Server {
  dc_receiver* r = nullptr;
  std::vector<std::vector<std::byte>> buffers;  // the "server's" own memory
  ~Server() { dc_receiver_free(r); }
};

class CApi : public ::testing::Test {
 protected:
  Model model;
  dc_producer* p = nullptr;
  std::vector<std::unique_ptr<Server>> servers;
  using Settings = std::vector<std::pair<std::string, std::string>>;
  Settings producer_settings, receiver_settings;  // more keys for every producer / receiver

  void TearDown() override {
    dc_producer_free(p);
    servers.clear();
  }

  void make_producer(int receivers) {
    ASSERT_EQ(dc_producer_create(&p), DC_OK);
    DC_EXPECT_OK(dc_producer_set(p, "receivers", std::to_string(receivers).c_str()));
    DC_EXPECT_OK(dc_producer_set(p, "listen", "tcp://127.0.0.1:0"));
    DC_EXPECT_OK(dc_producer_set(p, "topology", "binary"));
    DC_EXPECT_OK(dc_producer_set(p, "chunk_bytes", "64KiB"));
    DC_EXPECT_OK(dc_producer_set(p, "timeouts.join", "60s"));
    for (const auto& [key, value] : producer_settings) DC_EXPECT_OK(dc_producer_set(p, key.c_str(), value.c_str()));
    for (auto& t : model.tensors)
      DC_EXPECT_OK(dc_producer_add_tensor(p, t.name.c_str(), t.dtype, static_cast<int>(t.shape.size()),
                                          t.shape.data(), t.bytes.data(), t.bytes.size(), DC_DEVICE_HOST, 0));
  }
  void point_producer_at_model() {
    for (auto& t : model.tensors) DC_EXPECT_OK(dc_producer_set_data(p, t.name.c_str(), t.bytes.data(), t.bytes.size()));
  }
  // Creates, joins and attaches a receiver (join runs on `joiner` threads: the producer's start
  // waits for all of them).
  static void join_server(Server& s, const std::string& url, int rank, int* status, bool gated,
                          const Settings& settings) {
    *status = DC_OK;
    auto check = [&](int st) {
      if (st != DC_OK && *status == DC_OK) *status = st;
      return st == DC_OK;
    };
    if (!check(dc_receiver_create(&s.r))) return;
    if (!check(dc_receiver_set(s.r, "producer", url.c_str()))) return;
    if (!check(dc_receiver_set(s.r, "rank", std::to_string(rank).c_str()))) return;
    if (!check(dc_receiver_set(s.r, "listen", "tcp://127.0.0.1:0"))) return;
    if (!check(dc_receiver_set(s.r, "gated", gated ? "true" : "false"))) return;
    for (const auto& [key, value] : settings)
      if (!check(dc_receiver_set(s.r, key.c_str(), value.c_str()))) return;
    if (!check(dc_receiver_join(s.r, 60'000))) return;
    size_t n = 0;
    check(dc_receiver_tensor_count(s.r, &n));
    for (size_t i = 0; i < n; ++i) {
      const char* name;
      int dtype, ndim;
      int64_t shape[8];
      if (!check(dc_receiver_tensor(s.r, i, &name, &dtype, &ndim, shape, 8))) return;
      int64_t count = 1;
      for (int d = 0; d < ndim; ++d) count *= shape[d];
      s.buffers.emplace_back(static_cast<size_t>(count) * dc_dtype_size(dtype));
      if (!check(dc_receiver_attach(s.r, name, dtype, ndim, shape, s.buffers.back().data(), s.buffers.back().size(),
                                    DC_DEVICE_HOST, 0)))
        return;
    }
    check(dc_receiver_start(s.r));
  }
  void start_all(int receivers, std::set<int> gated = {}) {
    make_producer(receivers);
    const char* url = nullptr;
    DC_EXPECT_OK(dc_producer_url(p, &url));
    std::vector<std::thread> joiners;
    std::vector<int> statuses(static_cast<size_t>(receivers));
    for (int i = 0; i < receivers; ++i) {
      servers.push_back(std::make_unique<Server>());
      joiners.emplace_back(join_server, std::ref(*servers.back()), std::string(url), i + 1,
                           &statuses[static_cast<size_t>(i)], gated.count(i + 1) > 0, receiver_settings);
    }
    const int started = dc_producer_start(p, 60'000);
    for (auto& t : joiners) t.join();
    for (int st : statuses) ASSERT_EQ(st, DC_OK) << dc_status_name(st);
    ASSERT_EQ(started, DC_OK) << dc_status_name(started) << ": " << dc_last_error();
  }
  // Server s's buffers equal `m`'s tensors, byte for byte.
  bool holds(size_t s, const Model& m) const {
    for (size_t i = 0; i < m.tensors.size(); ++i)
      if (servers[s]->buffers[i] != m.tensors[i].bytes) return false;
    return true;
  }
  void expect_servers_hold_model(uint64_t version) {
    for (size_t s = 0; s < servers.size(); ++s) {
      ASSERT_EQ(dc_receiver_wait_version(servers[s]->r, version, 60'000), DC_OK) << dc_last_error();
      uint64_t v = 0, digest = 0;
      DC_EXPECT_OK(dc_receiver_version(servers[s]->r, &v, &digest));
      EXPECT_EQ(v, version);
      EXPECT_NE(digest, 0u);
      for (size_t i = 0; i < model.tensors.size(); ++i) {
        const auto& want = model.tensors[i].bytes;
        const auto& got = servers[s]->buffers[i];
        ASSERT_EQ(got.size(), want.size());
        EXPECT_TRUE(got == want)  // bytewise; memcmp would see an empty tensor's null storage
            << "server " << s + 1 << " tensor " << model.tensors[i].name << " at version " << version;
      }
    }
  }
};

TEST(CApiBasics, VersionStatusNamesAndDtypes) {
  EXPECT_EQ(dc_version_number(), static_cast<unsigned>(DC_VERSION_NUMBER));
  EXPECT_STREQ(dc_version_string(), "0.2.0");
  EXPECT_STREQ(dc_status_name(DC_OK), "DC_OK");
  EXPECT_STREQ(dc_status_name(DC_ERR_TIMEOUT), "DC_ERR_TIMEOUT");
  EXPECT_STREQ(dc_status_name(DC_ERR_INTERNAL), "DC_ERR_INTERNAL");
  EXPECT_STREQ(dc_status_name(12345), "DC_UNKNOWN_STATUS");
  for (int s = DC_ERR_INTERNAL; s <= DC_PENDING; ++s) EXPECT_STRNE(dc_status_name(s), "DC_UNKNOWN_STATUS") << s;
  EXPECT_EQ(dc_is_error(DC_OK), 0);
  EXPECT_EQ(dc_is_error(DC_PENDING), 0);
  EXPECT_EQ(dc_is_error(DC_ERR_STATE), 1);
  for (int d = DC_DTYPE_BOOL; d <= DC_DTYPE_F8_E5M2; ++d) {
    int back = -1;
    ASSERT_EQ(dc_dtype_from_name(dc_dtype_name(d), &back), DC_OK);
    EXPECT_EQ(back, d);
    EXPECT_GT(dc_dtype_size(d), 0u);
  }
  EXPECT_EQ(dc_dtype_size(DC_DTYPE_I64), 8u);
  EXPECT_EQ(dc_dtype_name(15), nullptr);
  int d = 0;
  EXPECT_EQ(dc_dtype_from_name("bfloat", &d), DC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dc_last_error()).find("bfloat"), std::string::npos);
}

TEST(CApiBasics, NullHandlesAndWrongStatesAreRefused) {
  dc_receiver_free(nullptr);
  dc_producer_free(nullptr);
  EXPECT_EQ(dc_receiver_create(nullptr), DC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dc_receiver_set(nullptr, "rank", "1"), DC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dc_last_error()).find("NULL"), std::string::npos);
  EXPECT_EQ(dc_receiver_start(nullptr), DC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dc_producer_refit(nullptr, 0), DC_ERR_INVALID_ARGUMENT);
  uint64_t v;
  EXPECT_EQ(dc_receiver_version(nullptr, &v, nullptr), DC_ERR_INVALID_ARGUMENT);

  dc_receiver* r = nullptr;
  ASSERT_EQ(dc_receiver_create(&r), DC_OK);
  EXPECT_EQ(dc_receiver_attach(r, "w", DC_DTYPE_BF16, 0, nullptr, nullptr, 0, DC_DEVICE_HOST, 0), DC_ERR_STATE);
  EXPECT_EQ(dc_receiver_start(r), DC_ERR_STATE);
  EXPECT_EQ(dc_receiver_wait_version(r, 1, 10), DC_ERR_STATE);
  EXPECT_EQ(dc_receiver_join(r, 100), DC_ERR_CONFIG);  // no producer set
  EXPECT_NE(std::string(dc_last_error()).find("producer"), std::string::npos);
  EXPECT_EQ(dc_receiver_set(r, "timeouts.peer", "soon"), DC_ERR_CONFIG);
  EXPECT_EQ(dc_receiver_set(r, "no_such_key", "1"), DC_ERR_CONFIG);
  EXPECT_EQ(dc_receiver_set(r, "timeouts.peer", "5s"), DC_OK);
  int kind;
  EXPECT_EQ(dc_receiver_poll_event(r, &kind, nullptr, nullptr, nullptr), DC_PENDING);
  EXPECT_EQ(dc_receiver_set(r, "gated", "maybe"), DC_ERR_CONFIG);
  EXPECT_EQ(dc_receiver_apply(r, nullptr), DC_ERR_STATE);
  uint16_t data[4] = {};
  EXPECT_EQ(dc_receiver_reattach(r, "w", data, sizeof data, DC_DEVICE_HOST, 0), DC_ERR_STATE);
  uint64_t applied = 9;
  size_t pending = 9;
  EXPECT_EQ(dc_receiver_pending(r, &applied, &pending), DC_OK);
  EXPECT_EQ(applied, 0u);
  EXPECT_EQ(pending, 0u);
  EXPECT_EQ(dc_receiver_pending(nullptr, &applied, &pending), DC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dc_receiver_apply(nullptr, nullptr), DC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dc_receiver_reattach(nullptr, "w", data, sizeof data, DC_DEVICE_HOST, 0), DC_ERR_INVALID_ARGUMENT);
  dc_receiver_free(r);

  dc_producer* p = nullptr;
  ASSERT_EQ(dc_producer_create(&p), DC_OK);
  EXPECT_EQ(dc_producer_refit(p, 0), DC_ERR_STATE);
  EXPECT_EQ(dc_producer_listen(p), DC_ERR_STATE);  // no tensors yet
  const int64_t shape[] = {4};
  uint16_t w[4] = {};
  EXPECT_EQ(dc_producer_add_tensor(p, "w", DC_DTYPE_BF16, 1, shape, w, 6, DC_DEVICE_HOST, 0), DC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dc_producer_add_tensor(p, "w", 99, 1, shape, w, 32, DC_DEVICE_HOST, 0), DC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dc_last_error()).find("99"), std::string::npos);
  int64_t positions[4] = {0, -1, INT64_MAX, INT64_MIN};  // every safetensors dtype is handled, I64 included
  EXPECT_EQ(dc_producer_add_tensor(p, "positions", DC_DTYPE_I64, 1, shape, positions, sizeof positions, DC_DEVICE_HOST, 0),
            DC_OK);
  // Host memory given as CUDA memory: UNSUPPORTED without a CUDA build or device (here), refused as
  // not device memory (INVALID_ARGUMENT) where one exists. Either way nothing is registered.
  const int as_cuda = dc_producer_add_tensor(p, "w", DC_DTYPE_BF16, 1, shape, w, 8, DC_DEVICE_CUDA, 0);
  EXPECT_TRUE(as_cuda == DC_ERR_UNSUPPORTED || as_cuda == DC_ERR_INVALID_ARGUMENT) << as_cuda;
  EXPECT_NE(std::string(dc_last_error()).find("CUDA"), std::string::npos) << dc_last_error();
  EXPECT_EQ(dc_producer_add_tensor(p, "w", DC_DTYPE_BF16, 1, shape, w, 8, DC_DEVICE_HOST, 0), DC_OK);
  EXPECT_EQ(dc_producer_add_tensor(p, "w", DC_DTYPE_BF16, 1, shape, w, 8, DC_DEVICE_HOST, 0), DC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dc_producer_listen(p), DC_ERR_CONFIG);  // receivers not set
  EXPECT_EQ(dc_producer_set(p, "receivers", "0"), DC_OK);
  EXPECT_EQ(dc_producer_listen(p), DC_ERR_CONFIG);
  dc_producer_free(p);
}

TEST(CApiErrors, TheEnvironmentIsAppliedAsTheCliAppliesIt) {
  ::setenv("DELTACAST_TIMEOUTS_PEER", "soon", 1);
  dc_receiver* r = nullptr;
  EXPECT_EQ(dc_receiver_create(&r), DC_ERR_CONFIG);
  EXPECT_EQ(r, nullptr);
  EXPECT_NE(std::string(dc_last_error()).find("DELTACAST_TIMEOUTS_PEER"), std::string::npos) << dc_last_error();
  dc_producer* p = nullptr;
  EXPECT_EQ(dc_producer_create(&p), DC_ERR_CONFIG);
  ::setenv("DELTACAST_TIMEOUTS_PEER", "3s", 1);
  ASSERT_EQ(dc_receiver_create(&r), DC_OK) << dc_last_error();
  ::unsetenv("DELTACAST_TIMEOUTS_PEER");
  dc_receiver_free(r);
}

TEST(CApiErrors, AnUnreachableProducerIsAConnectionError) {
  dc_receiver* r = nullptr;
  ASSERT_EQ(dc_receiver_create(&r), DC_OK);
  DC_EXPECT_OK(dc_receiver_set(r, "producer", "tcp://127.0.0.1:1"));  // nothing listens on port 1
  DC_EXPECT_OK(dc_receiver_set(r, "rank", "1"));
  DC_EXPECT_OK(dc_receiver_set(r, "timeouts.connect", "500ms"));
  EXPECT_EQ(dc_receiver_join(r, 1500), DC_ERR_CONNECTION);
  EXPECT_NE(std::string(dc_last_error()).find("cannot reach the producer"), std::string::npos) << dc_last_error();
  EXPECT_EQ(dc_receiver_start(r), DC_ERR_STATE);
  dc_receiver_free(r);
}

TEST(CApiErrors, AReceiverWithAnotherSecretIsRefused) {
  char dir[] = "/tmp/dc-capi-secret.XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string a = std::string(dir) + "/a", b = std::string(dir) + "/b";
  for (const auto& [path, text] : {std::pair{a, std::string(64, 'a')}, std::pair{b, std::string(64, 'b')}}) {
    FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(text.c_str(), f);
    std::fclose(f);
    ::chmod(path.c_str(), 0600);
  }
  dc_producer* p = nullptr;
  ASSERT_EQ(dc_producer_create(&p), DC_OK);
  DC_EXPECT_OK(dc_producer_set(p, "receivers", "1"));
  DC_EXPECT_OK(dc_producer_set(p, "secret_file", a.c_str()));
  const int64_t shape[] = {8};
  uint16_t w[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  DC_EXPECT_OK(dc_producer_add_tensor(p, "w", DC_DTYPE_BF16, 1, shape, w, sizeof w, DC_DEVICE_HOST, 0));
  const char* url = nullptr;
  DC_EXPECT_OK(dc_producer_url(p, &url));
  dc_receiver* r = nullptr;
  ASSERT_EQ(dc_receiver_create(&r), DC_OK);
  DC_EXPECT_OK(dc_receiver_set(r, "producer", url));
  DC_EXPECT_OK(dc_receiver_set(r, "rank", "1"));
  DC_EXPECT_OK(dc_receiver_set(r, "secret_file", b.c_str()));
  DC_EXPECT_OK(dc_receiver_set(r, "timeouts.connect", "1s"));
  const int joined = dc_receiver_join(r, 2000);
  EXPECT_TRUE(joined == DC_ERR_AUTH || joined == DC_ERR_CONNECTION) << dc_status_name(joined);
  const std::string why = dc_last_error();
  EXPECT_NE(why.find("auth"), std::string::npos) << why;
  dc_receiver_free(r);
  dc_producer_free(p);
  std::remove(a.c_str());
  std::remove(b.c_str());
  ::rmdir(dir);
}

TEST_F(CApi, RefitsLandBitExactInTheServersOwnBuffers) {
  start_all(3);
  // Buffers are never reallocated: remember where they are.
  std::vector<const std::byte*> where;
  for (auto& s : servers)
    for (auto& b : s->buffers) where.push_back(b.data());
  expect_servers_hold_model(1);
  for (int k = 1; k <= 3; ++k) {
    model.step(k, k == 3 ? 1.0 : 0.01);  // step 3 changes (nearly) everything
    point_producer_at_model();
    ASSERT_EQ(dc_producer_refit(p, 0), DC_OK) << dc_last_error();
    const char* json = nullptr;
    DC_EXPECT_OK(dc_producer_report(p, &json));
    const std::string report(json);
    EXPECT_NE(report.find("\"committed\":true"), std::string::npos) << report;
    EXPECT_NE(report.find("\"verified_receivers\":3"), std::string::npos) << report;
    EXPECT_NE(report.find("\"failed_members\":[]"), std::string::npos) << report;
    uint64_t pv = 0;
    DC_EXPECT_OK(dc_producer_version(p, &pv));
    EXPECT_EQ(pv, static_cast<uint64_t>(k + 1));
    expect_servers_hold_model(static_cast<uint64_t>(k + 1));
  }
  size_t i = 0;
  for (auto& s : servers)
    for (auto& b : s->buffers) EXPECT_EQ(b.data(), where[i++]);
  // A refit with nothing changed still commits a version.
  ASSERT_EQ(dc_producer_refit(p, 0), DC_OK) << dc_last_error();
  expect_servers_hold_model(5);
  // Every server saw a COMMITTED event per version, in order.
  for (auto& s : servers) {
    uint64_t expected = 1;
    int kind, status;
    uint64_t version;
    const char* message;
    while (dc_receiver_poll_event(s->r, &kind, &version, &status, &message) == DC_OK) {
      EXPECT_EQ(kind, DC_EVENT_COMMITTED);
      EXPECT_EQ(version, expected++);
    }
    EXPECT_EQ(expected, 6u);
  }
}

// clusters: auto with a probe file (docs/config.md): the producer takes rank 0's cluster and each
// receiver the cluster of its rank, so the trees are rooted in the producer's cluster.
class CApiProbeFile : public CApi {
 protected:
  std::string probe = testing::TempDir() + "/capi-probe-" + std::to_string(::getpid()) + ".json";
  void TearDown() override {
    CApi::TearDown();
    std::remove(probe.c_str());
  }
  // Starts 3 receivers with clusters from `clusters_json`, refits once, and returns the delegate
  // of that version's commit (the report's commit_delegate; 0: the producer decided).
  int refit_and_delegate(const std::string& clusters_json, const std::string& commit) {
    std::ofstream(probe) << R"({"ranks": 4, "clusters": )" << clusters_json << "}";
    producer_settings = {{"clusters", "auto"}, {"probe_file", probe}, {"commit", commit}};
    receiver_settings = {{"clusters", "auto"}, {"probe_file", probe}};
    start_all(3);
    if (HasFatalFailure()) return -1;
    model.step(1, 0.01);
    point_producer_at_model();
    EXPECT_EQ(dc_producer_refit(p, 0), DC_OK) << dc_last_error();
    expect_servers_hold_model(2);
    const char* json = nullptr;
    EXPECT_EQ(dc_producer_report(p, &json), DC_OK);
    const std::string report(json ? json : "");
    const size_t at = report.find("\"commit_delegate\":");
    if (at == std::string::npos) {
      ADD_FAILURE() << report;
      return -1;
    }
    return std::stoi(report.substr(at + 18));
  }
};

TEST_F(CApiProbeFile, EverySideTakesItsClusterSoTheTreeIsRootedBesideTheProducer) {
  // Rank 3 shares the producer's cluster: every tree is rooted there, so the delegated commit is
  // rank 3's. Had the receivers kept one label, tree 0's root (the delegate) would be rank 1; had
  // the producer ignored the file, rank 3 would not be first either.
  EXPECT_EQ(refit_and_delegate("[[0, 3], [1, 2]]", "delegated"), 3);
}

TEST_F(CApiProbeFile, AProducerAloneInItsClusterDelegatesTheCommit) {
  // commit: auto delegates when no member shares the producer's cluster (here: the probe's).
  const int delegate = refit_and_delegate("[[0], [1, 2, 3]]", "auto");
  EXPECT_GE(delegate, 1);
  EXPECT_LE(delegate, 3);
}

TEST(CApiErrors, ClustersAutoNeedsAProbeFileOfThisJob) {
  const std::string probe = testing::TempDir() + "/capi-probe-bad-" + std::to_string(::getpid()) + ".json";
  std::ofstream(probe) << R"({"ranks": 9, "clusters": [[0, 1], [2, 3, 4, 5, 6, 7, 8]]})";
  std::vector<std::byte> data(64);
  const int64_t dims[1] = {32};
  auto producer_with = [&](const std::string& probe_file) {
    dc_producer* p = nullptr;
    EXPECT_EQ(dc_producer_create(&p), DC_OK);
    EXPECT_EQ(dc_producer_set(p, "receivers", "3"), DC_OK);
    EXPECT_EQ(dc_producer_set(p, "clusters", "auto"), DC_OK);
    if (!probe_file.empty()) {
      EXPECT_EQ(dc_producer_set(p, "probe_file", probe_file.c_str()), DC_OK);
    }
    EXPECT_EQ(dc_producer_add_tensor(p, "w", DC_DTYPE_BF16, 1, dims, data.data(), data.size(), DC_DEVICE_HOST, 0),
              DC_OK);
    const int status = dc_producer_listen(p);
    const std::string error = dc_last_error();
    dc_producer_free(p);
    return std::make_pair(status, error);
  };
  auto [status, error] = producer_with("");
  EXPECT_EQ(status, DC_ERR_CONFIG);
  EXPECT_NE(error.find("needs probe_file"), std::string::npos) << error;
  std::tie(status, error) = producer_with(probe);
  EXPECT_EQ(status, DC_ERR_CONFIG);
  EXPECT_NE(error.find("measured 9 ranks, but this job has 4"), std::string::npos) << error;
  // A receiver cannot name its cluster and take it from the probe too; nor go without the file.
  for (const bool with_file : {true, false}) {
    dc_receiver* r = nullptr;
    ASSERT_EQ(dc_receiver_create(&r), DC_OK);
    EXPECT_EQ(dc_receiver_set(r, "producer", "tcp://127.0.0.1:1"), DC_OK);
    EXPECT_EQ(dc_receiver_set(r, "rank", "1"), DC_OK);
    EXPECT_EQ(dc_receiver_set(r, "clusters", "auto"), DC_OK);
    if (with_file) {
      EXPECT_EQ(dc_receiver_set(r, "probe_file", probe.c_str()), DC_OK);
      EXPECT_EQ(dc_receiver_set(r, "cluster", "rack-7"), DC_OK);
    }
    EXPECT_EQ(dc_receiver_join(r, 2000), DC_ERR_CONFIG);
    const std::string message = dc_last_error();
    EXPECT_NE(message.find(with_file ? "not both" : "needs probe_file"), std::string::npos) << message;
    dc_receiver_free(r);
  }
  std::remove(probe.c_str());
}

TEST_F(CApi, DryRunIsVerifiedThenRolledBackWithAnEvent) {
  start_all(2);
  expect_servers_hold_model(1);
  const Model before = model;
  model.step(1, 0.05);
  point_producer_at_model();
  ASSERT_EQ(dc_producer_refit(p, 1), DC_OK) << dc_last_error();
  const char* json = nullptr;
  DC_EXPECT_OK(dc_producer_report(p, &json));
  EXPECT_NE(std::string(json).find("\"committed\":false"), std::string::npos) << json;
  EXPECT_NE(std::string(json).find("\"verified_receivers\":2"), std::string::npos) << json;
  uint64_t pv = 0;
  DC_EXPECT_OK(dc_producer_version(p, &pv));
  EXPECT_EQ(pv, 1u);
  for (auto& s : servers) {
    // The ROLLED_BACK event arrives once the receiver rolled back.
    int kind = 0, status = 0;
    uint64_t version = 0;
    for (int tries = 0; tries < 500 && kind != DC_EVENT_ROLLED_BACK; ++tries) {
      if (dc_receiver_poll_event(s->r, &kind, &version, &status, nullptr) != DC_OK)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_EQ(kind, DC_EVENT_ROLLED_BACK);
    EXPECT_EQ(version, 2u);
    EXPECT_EQ(status, DC_ERR_ABORTED);
    uint64_t v = 0;
    DC_EXPECT_OK(dc_receiver_version(s->r, &v, nullptr));
    EXPECT_EQ(v, 1u);
    for (size_t i = 0; i < before.tensors.size(); ++i)
      EXPECT_TRUE(s->buffers[i] == before.tensors[i].bytes) << before.tensors[i].name;
  }
  // The chain goes on from version 1.
  ASSERT_EQ(dc_producer_refit(p, 0), DC_OK) << dc_last_error();
  expect_servers_hold_model(2);
}

// The apply gate: gated servers (1 and 3; rank 1 is the tree's root and relays) verify and commit
// every version without a write into their buffers, which change only at dc_receiver_apply.
TEST_F(CApi, GatedServersCommitWithoutWritingAndApplyAtTheirSafePoint) {
  start_all(3, {1, 3});
  expect_servers_hold_model(1);  // the bootstrap is never gated
  const Model v1 = model;
  for (int k = 1; k <= 2; ++k) {
    model.step(k, 0.01);
    point_producer_at_model();
    ASSERT_EQ(dc_producer_refit(p, 0), DC_OK) << dc_last_error();
    for (auto& s : servers) ASSERT_EQ(dc_receiver_wait_version(s->r, static_cast<uint64_t>(k + 1), 60'000), DC_OK);
    EXPECT_TRUE(holds(0, v1)) << "gated server 1 was written before apply";
    EXPECT_TRUE(holds(2, v1)) << "gated server 3 was written before apply";
    EXPECT_TRUE(holds(1, model)) << "ungated server 2 does not hold version " << k + 1;
  }
  uint64_t applied = 0, committed = 0;
  size_t pending = 0;
  DC_EXPECT_OK(dc_receiver_pending(servers[0]->r, &applied, &pending));
  EXPECT_EQ(applied, 1u);
  EXPECT_EQ(pending, 2u);
  DC_EXPECT_OK(dc_receiver_version(servers[0]->r, &committed, nullptr));
  EXPECT_EQ(committed, 3u);
  DC_EXPECT_OK(dc_receiver_pending(servers[1]->r, &applied, &pending));
  EXPECT_EQ(applied, 3u);
  EXPECT_EQ(pending, 0u);
  ASSERT_EQ(dc_receiver_apply(servers[0]->r, &applied), DC_OK) << dc_last_error();
  EXPECT_EQ(applied, 3u);
  EXPECT_TRUE(holds(0, model));
  DC_EXPECT_OK(dc_receiver_pending(servers[0]->r, &applied, &pending));
  EXPECT_EQ(pending, 0u);
  // Ungated, apply is a no-op; server 3 applies after one more version.
  DC_EXPECT_OK(dc_receiver_apply(servers[1]->r, &applied));
  EXPECT_EQ(applied, 3u);
  model.step(3, 0.01);
  point_producer_at_model();
  ASSERT_EQ(dc_producer_refit(p, 0), DC_OK) << dc_last_error();
  ASSERT_EQ(dc_receiver_wait_version(servers[2]->r, 4, 60'000), DC_OK);
  EXPECT_TRUE(holds(2, v1));
  ASSERT_EQ(dc_receiver_apply(servers[2]->r, &applied), DC_OK) << dc_last_error();
  EXPECT_EQ(applied, 4u);
  EXPECT_TRUE(holds(2, model));
  // COMMITTED events came for every version on gated servers too.
  uint64_t expected = 1;
  int kind, status;
  uint64_t version;
  while (dc_receiver_poll_event(servers[2]->r, &kind, &version, &status, nullptr) == DC_OK) {
    EXPECT_EQ(kind, DC_EVENT_COMMITTED);
    EXPECT_EQ(version, expected++);
  }
  EXPECT_EQ(expected, 5u);
}

// A restarted server that kept its weights offers the version it held (held_version/held_digest
// from dc_receiver_version before it went down) and rejoins without a full snapshot. A digest the
// producer does not know for that version, a version it never committed, and buffers that do not
// hold the offered bits are each refused with their own status and nothing written.
TEST_F(CApi, ARestartedServerRejoinsWithTheVersionItHeld) {
  start_all(3);
  expect_servers_hold_model(1);
  model.step(1, 0.01);
  point_producer_at_model();
  ASSERT_EQ(dc_producer_refit(p, 0), DC_OK) << dc_last_error();
  expect_servers_hold_model(2);
  uint64_t held = 0, digest = 0;
  DC_EXPECT_OK(dc_receiver_version(servers[2]->r, &held, &digest));
  ASSERT_EQ(held, 2u);
  std::vector<std::vector<std::byte>> kept = servers[2]->buffers;  // what the server saved
  servers.pop_back();  // rank 3 leaves; the others go on
  model.step(2, 0.01);
  point_producer_at_model();
  ASSERT_EQ(dc_producer_refit(p, 0), DC_OK) << dc_last_error();
  char hex[32];
  auto rejoin = [&](uint64_t version, uint64_t d, std::vector<std::vector<std::byte>> buffers, int* join_status) {
    auto s = std::make_unique<Server>();
    *join_status = DC_OK;
    const char* url = nullptr;
    EXPECT_EQ(dc_producer_url(p, &url), DC_OK);
    EXPECT_EQ(dc_receiver_create(&s->r), DC_OK);
    EXPECT_EQ(dc_receiver_set(s->r, "producer", url), DC_OK);
    EXPECT_EQ(dc_receiver_set(s->r, "rank", "3"), DC_OK);
    EXPECT_EQ(dc_receiver_set(s->r, "listen", "tcp://127.0.0.1:0"), DC_OK);
    EXPECT_EQ(dc_receiver_set(s->r, "held_version", std::to_string(version).c_str()), DC_OK);
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(d));
    EXPECT_EQ(dc_receiver_set(s->r, "held_digest", hex), DC_OK);
    *join_status = dc_receiver_join(s->r, 30'000);
    if (*join_status != DC_OK) return s;
    s->buffers = std::move(buffers);
    for (size_t i = 0; i < model.tensors.size(); ++i) {
      const auto& t = model.tensors[i];
      EXPECT_EQ(dc_receiver_attach(s->r, t.name.c_str(), t.dtype, static_cast<int>(t.shape.size()), t.shape.data(),
                                   s->buffers[i].data(), s->buffers[i].size(), DC_DEVICE_HOST, 0),
                DC_OK);
    }
    return s;
  };
  int status = DC_OK;
  auto wrong_digest = rejoin(2, digest ^ 1, kept, &status);
  EXPECT_EQ(status, DC_ERR_VERIFY_FAILED) << dc_last_error();
  auto ahead = rejoin(9, digest, kept, &status);
  EXPECT_EQ(status, DC_ERR_VERSION_MISMATCH) << dc_last_error();
  auto other_bits = kept;
  other_bits[0][3] ^= std::byte{1};
  auto mismatched = rejoin(2, digest, other_bits, &status);
  ASSERT_EQ(status, DC_OK) << dc_last_error();
  EXPECT_EQ(dc_receiver_start(mismatched->r), DC_ERR_VERIFY_FAILED);
  EXPECT_NE(std::string(dc_last_error()).find("held_digest"), std::string::npos) << dc_last_error();
  EXPECT_EQ(mismatched->buffers, other_bits) << "a refused start wrote into the buffers";
  mismatched.reset();
  auto back = rejoin(2, digest, kept, &status);
  ASSERT_EQ(status, DC_OK) << dc_last_error();
  ASSERT_EQ(dc_receiver_start(back->r), DC_OK) << dc_last_error();
  servers.push_back(std::move(back));
  expect_servers_hold_model(3);
  model.step(3, 0.01);
  point_producer_at_model();
  ASSERT_EQ(dc_producer_refit(p, 0), DC_OK) << dc_last_error();
  const char* json = nullptr;
  DC_EXPECT_OK(dc_producer_report(p, &json));
  EXPECT_NE(std::string(json).find("\"verified_receivers\":3"), std::string::npos) << json;
  expect_servers_hold_model(4);
}

// A "producer" that answers with bytes that are not deltacast's: its answer to the authentication
// handshake (which runs with or without a secret_file) fails, and join says so at once.
TEST(CApiErrors, GarbageFromTheProducerFailsAuthentication) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  std::thread junk([listener] {
    const int c = ::accept(listener, nullptr, nullptr);
    if (c < 0) return;
    std::vector<unsigned char> bytes(4096);
    std::mt19937 rng(1);
    for (auto& b : bytes) b = static_cast<unsigned char>(rng());
    for (int i = 0; i < 16; ++i)
      if (::send(c, bytes.data(), bytes.size(), MSG_NOSIGNAL) < 0) break;
    ::sleep(1);
    ::close(c);
  });
  dc_receiver* r = nullptr;
  ASSERT_EQ(dc_receiver_create(&r), DC_OK);
  const std::string url = "tcp://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  DC_EXPECT_OK(dc_receiver_set(r, "producer", url.c_str()));
  DC_EXPECT_OK(dc_receiver_set(r, "rank", "1"));
  const int status = dc_receiver_join(r, 2000);
  EXPECT_EQ(status, DC_ERR_AUTH) << dc_status_name(status) << ": " << dc_last_error();
  EXPECT_NE(std::string(dc_last_error()).find("not a deltacast endpoint"), std::string::npos) << dc_last_error();
  dc_receiver_free(r);
  junk.join();
  ::close(listener);
}

// A server that reallocated a tensor hands deltacast the new memory; refits land there and the
// old memory is left alone. A buffer with other bits, another size, an unknown name or CUDA memory
// is refused with nothing changed.
TEST_F(CApi, ReattachMovesATensorToTheServersNewMemory) {
  start_all(2);
  expect_servers_hold_model(1);
  Server& s = *servers[0];
  const std::string name = model.tensors[0].name;
  std::vector<std::byte> moved = s.buffers[0];
  std::vector<std::byte> wrong = moved;
  wrong[10] ^= std::byte{1};
  EXPECT_EQ(dc_receiver_reattach(s.r, name.c_str(), wrong.data(), wrong.size(), DC_DEVICE_HOST, 0),
            DC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dc_last_error()).find("bits"), std::string::npos) << dc_last_error();
  EXPECT_EQ(dc_receiver_reattach(s.r, name.c_str(), moved.data(), moved.size() - 2, DC_DEVICE_HOST, 0),
            DC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dc_receiver_reattach(s.r, "no.such.tensor", moved.data(), moved.size(), DC_DEVICE_HOST, 0),
            DC_ERR_NOT_FOUND);
  EXPECT_EQ(dc_receiver_reattach(s.r, name.c_str(), moved.data(), moved.size(), DC_DEVICE_CUDA, 0),
            DC_ERR_UNSUPPORTED);
  ASSERT_EQ(dc_receiver_reattach(s.r, name.c_str(), moved.data(), moved.size(), DC_DEVICE_HOST, 0), DC_OK)
      << dc_last_error();
  const std::vector<std::byte> old = s.buffers[0];
  model.step(1, 0.02);
  point_producer_at_model();
  ASSERT_EQ(dc_producer_refit(p, 0), DC_OK) << dc_last_error();
  ASSERT_EQ(dc_receiver_wait_version(s.r, 2, 60'000), DC_OK);
  EXPECT_EQ(s.buffers[0], old) << "the old memory was written after reattach";
  EXPECT_EQ(std::memcmp(moved.data(), model.tensors[0].bytes.data(), moved.size()), 0);
  s.buffers[0].swap(moved);  // the server's tensor is the new memory now (no reallocation)
  expect_servers_hold_model(2);
}

TEST_F(CApi, BadAttachesAreRefusedWithNothingWritten) {
  make_producer(1);
  const char* url = nullptr;
  DC_EXPECT_OK(dc_producer_url(p, &url));
  int started = DC_ERR_INTERNAL;
  std::thread producer([&] { started = dc_producer_start(p, 60'000); });
  Server s;
  ASSERT_EQ(dc_receiver_create(&s.r), DC_OK);
  DC_EXPECT_OK(dc_receiver_set(s.r, "producer", url));
  DC_EXPECT_OK(dc_receiver_set(s.r, "rank", "1"));
  DC_EXPECT_OK(dc_receiver_join(s.r, 60'000));
  const auto& t = model.tensors[0];  // BF16 [257, 129]
  std::vector<std::byte> buffer(t.bytes.size(), std::byte{0x5a});
  const auto pristine = buffer;
  const int64_t wrong_shape[] = {129, 257};
  EXPECT_EQ(dc_receiver_attach(s.r, t.name.c_str(), DC_DTYPE_F16, 2, t.shape.data(), buffer.data(), buffer.size(),
                               DC_DEVICE_HOST, 0),
            DC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dc_last_error()).find("BF16"), std::string::npos) << dc_last_error();
  EXPECT_EQ(dc_receiver_attach(s.r, t.name.c_str(), DC_DTYPE_BF16, 2, wrong_shape, buffer.data(), buffer.size(),
                               DC_DEVICE_HOST, 0),
            DC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dc_receiver_attach(s.r, t.name.c_str(), DC_DTYPE_BF16, 1, t.shape.data(), buffer.data(), buffer.size(),
                               DC_DEVICE_HOST, 0),
            DC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dc_receiver_attach(s.r, t.name.c_str(), DC_DTYPE_BF16, 2, t.shape.data(), buffer.data(), buffer.size() - 2,
                               DC_DEVICE_HOST, 0),
            DC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dc_receiver_attach(s.r, "no.such.tensor", DC_DTYPE_BF16, 2, t.shape.data(), buffer.data(), buffer.size(),
                               DC_DEVICE_HOST, 0),
            DC_ERR_NOT_FOUND);
  const int as_cuda = dc_receiver_attach(s.r, t.name.c_str(), DC_DTYPE_BF16, 2, t.shape.data(), buffer.data(),
                                               buffer.size(), DC_DEVICE_CUDA, 0);
  EXPECT_TRUE(as_cuda == DC_ERR_UNSUPPORTED || as_cuda == DC_ERR_INVALID_ARGUMENT) << as_cuda;  // no device / not device memory
  EXPECT_EQ(buffer, pristine);
  // Missing tensors at start: refused, naming them.
  EXPECT_EQ(dc_receiver_start(s.r), DC_ERR_STATE);
  EXPECT_NE(std::string(dc_last_error()).find("not attached"), std::string::npos) << dc_last_error();
  EXPECT_EQ(buffer, pristine);
  // Now attach everything properly and serve; attaching after start is refused.
  for (auto& m : model.tensors) {
    s.buffers.emplace_back(m.bytes.size());
    DC_EXPECT_OK(dc_receiver_attach(s.r, m.name.c_str(), m.dtype, static_cast<int>(m.shape.size()), m.shape.data(),
                                    s.buffers.back().data(), s.buffers.back().size(), DC_DEVICE_HOST, 0));
  }
  DC_EXPECT_OK(dc_receiver_start(s.r));
  EXPECT_EQ(dc_receiver_attach(s.r, t.name.c_str(), DC_DTYPE_BF16, 2, t.shape.data(), buffer.data(), buffer.size(),
                               DC_DEVICE_HOST, 0),
            DC_ERR_STATE);
  EXPECT_EQ(dc_receiver_set(s.r, "rank", "2"), DC_ERR_STATE);
  producer.join();
  ASSERT_EQ(started, DC_OK);
  ASSERT_EQ(dc_receiver_wait_version(s.r, 1, 60'000), DC_OK) << dc_last_error();
  EXPECT_EQ(buffer, pristine);
  for (size_t i = 0; i < model.tensors.size(); ++i)
    EXPECT_TRUE(s.buffers[i] == model.tensors[i].bytes) << model.tensors[i].name;  // bytewise, empty ones too
  // A wait for a version that never comes times out.
  EXPECT_EQ(dc_receiver_wait_version(s.r, 7, 50), DC_ERR_TIMEOUT);
}

TEST_F(CApi, ALeavingReceiverIsRepairedAroundAndTheOthersGoOn) {
  start_all(3);
  expect_servers_hold_model(1);
  // Rank 1 (the root of the binary tree) leaves: free() closes its links.
  dc_receiver_free(servers[0]->r);
  servers[0]->r = nullptr;
  servers.erase(servers.begin());
  model.step(1, 0.01);
  point_producer_at_model();
  ASSERT_EQ(dc_producer_refit(p, 0), DC_OK) << dc_last_error();
  const char* json = nullptr;
  DC_EXPECT_OK(dc_producer_report(p, &json));
  EXPECT_NE(std::string(json).find("\"verified_receivers\":2"), std::string::npos) << json;
  expect_servers_hold_model(2);
}

TEST_F(CApi, TheProducersEndEndsTheReceivers) {
  start_all(2);
  expect_servers_hold_model(1);
  dc_producer_free(p);  // BYE
  p = nullptr;
  for (auto& s : servers) {
    EXPECT_EQ(dc_receiver_wait_version(s->r, 2, 30'000), DC_ERR_STATE);  // ended at version 1
    EXPECT_NE(std::string(dc_last_error()).find("ended"), std::string::npos) << dc_last_error();
    int kind = 0;
    uint64_t version = 0;
    int status = 0;
    while (dc_receiver_poll_event(s->r, &kind, &version, &status, nullptr) == DC_OK && kind != DC_EVENT_ENDED) {
    }
    EXPECT_EQ(kind, DC_EVENT_ENDED);
    EXPECT_EQ(status, DC_OK);
  }
}

#ifdef DELTACAST_EMBED_RECEIVER
// A server process (examples/embed/receiver.c) registers its own buffers: deltacast keeps no
// shadow copy, so the process's peak resident size stays within 1.2x the model plus the frames
// it retains (the deltas of the versions it keeps to serve replays, and the one in flight).
// examples/embed/receiver.c serving a 384 MiB model, ungated and gated: its peak RSS beyond the
// model stays within 0.2x the model plus the retained deltas; gated, plus what the gate holds: 8
// bytes per changed element of each version committed but not yet applied (at most 2 here) and
// one chunk (chunk_bytes, 16 MiB by default) of staging copy per relay thread (one tree here).
class CApiMemory : public ::testing::TestWithParam<bool> {};

TEST_P(CApiMemory, AServerHoldsNoShadowCopyOfItsModel) {
  const bool gated = GetParam();
  constexpr size_t kElements = size_t{192} << 20;  // 384 MiB of BF16: fixed costs (buffers, threads) do not dominate
  std::vector<uint16_t> weights(kElements);
  std::mt19937 rng(3);
  for (auto& w : weights) w = static_cast<uint16_t>(0x3c00 + rng() % 0x200);
  dc_producer* p = nullptr;
  ASSERT_EQ(dc_producer_create(&p), DC_OK);
  DC_EXPECT_OK(dc_producer_set(p, "receivers", "1"));
  DC_EXPECT_OK(dc_producer_set(p, "timeouts.join", "120s"));
  const int64_t shape[] = {static_cast<int64_t>(kElements / 1024), 1024};
  DC_EXPECT_OK(dc_producer_add_tensor(p, "w", DC_DTYPE_BF16, 2, shape, weights.data(), kElements * 2, DC_DEVICE_HOST, 0));
  const char* url = nullptr;
  DC_EXPECT_OK(dc_producer_url(p, &url));
  constexpr int kRefits = 3;
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  std::string url_arg = url, last = std::to_string(1 + kRefits);
  char* argv[] = {const_cast<char*>(DELTACAST_EMBED_RECEIVER), url_arg.data(), const_cast<char*>("1"), last.data(),
                  const_cast<char*>(gated ? "gated=true" : "gated=false"), nullptr};
  pid_t child = 0;
  ASSERT_EQ(posix_spawn(&child, DELTACAST_EMBED_RECEIVER, &actions, nullptr, argv, environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  ASSERT_EQ(dc_producer_start(p, 120'000), DC_OK) << dc_last_error();
  uint64_t retained = 0;
  for (int k = 0; k < kRefits; ++k) {
    for (size_t i = static_cast<size_t>(k); i < kElements; i += 97) weights[i] ^= 0x5;  // ~1%
    ASSERT_EQ(dc_producer_refit(p, 0), DC_OK) << dc_last_error();
    const char* json = nullptr;
    DC_EXPECT_OK(dc_producer_report(p, &json));
    const std::string report(json);
    const auto at = report.find("\"payload_bytes\":");
    ASSERT_NE(at, std::string::npos);
    retained += std::stoull(report.substr(at + 16));
  }
  dc_producer_free(p);
  std::string text;
  char chunk[4096];
  for (ssize_t n; (n = ::read(out[0], chunk, sizeof chunk)) > 0;) text.append(chunk, static_cast<size_t>(n));
  ::close(out[0]);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << text;
  const auto done = text.find("done ");
  ASSERT_NE(done, std::string::npos) << text;
  auto field = [&](const char* key) {
    const auto at = text.find(std::string(key) + "=", done);
    EXPECT_NE(at, std::string::npos) << key;
    return std::stoull(text.substr(at + std::strlen(key) + 1));
  };
  const double model = static_cast<double>(field("model_bytes"));
  const double before = 1024.0 * static_cast<double>(field("rss_before_kib"));
  const double peak = 1024.0 * static_cast<double>(field("rss_peak_kib"));
  EXPECT_EQ(field("model_bytes"), kElements * 2);
  EXPECT_EQ(field("version"), static_cast<uint64_t>(1 + kRefits));
  // rss_before holds the model (allocated and zeroed) plus the process's own baseline.
  const double held = peak - before;
  RecordProperty("model_bytes", std::to_string(model));
  RecordProperty("deltacast_peak_extra_bytes", std::to_string(held));
  std::printf("model %.1f MiB, rss before start %.1f MiB, peak %.1f MiB: deltacast held at most %.1f MiB "
              "(%.3f of the model; retained deltas %.1f MiB)\n",
              model / 1048576, before / 1048576, peak / 1048576, held / 1048576, held / model,
              static_cast<double>(retained) / 1048576);
  const double queued = gated ? 2.0 * 8.0 * static_cast<double>(kElements / 97 + 1) + 16.0 * 1048576 : 0.0;
#if defined(__SANITIZE_ADDRESS__)
  // Under ASan the peak holds its shadow (1/8 of what is touched) and its quarantine (up to 256
  // MiB of freed memory held back): not deltacast's to bound. The rest of the test still runs.
  std::printf("peak not bounded under AddressSanitizer\n");
#else
  EXPECT_LE(held, 0.2 * model + static_cast<double>(retained) + queued);
#endif
}
INSTANTIATE_TEST_SUITE_P(Gate, CApiMemory, ::testing::Bool(),
                         [](const auto& param_info) { return param_info.param ? "gated" : "ungated"; });
#endif

}  // namespace
