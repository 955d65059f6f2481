// The YAML loader: valid files, each kind of bad input with its line:column, override precedence.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>

#include "config/config.h"
#include "util/error.h"

namespace deltacast::config {
namespace {

using namespace std::chrono_literals;

EnvLookup no_env() {
  return [](const std::string&) -> std::optional<std::string> { return std::nullopt; };
}

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// The message of the Error(config) that parse_config throws for `yaml`.
std::string parse_error(const std::string& yaml) {
  try {
    parse_config(yaml, "test.yaml");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::config);
    return e.what();
  }
  ADD_FAILURE() << "accepted:\n" << yaml;
  return "";
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(Config, ExampleLocal9LoadsWithEveryKey) {
  const Config c = load_config(std::string(DELTACAST_SOURCE_DIR) + "/examples/local-9.yaml", no_env());
  EXPECT_EQ(c.producer, "tcp://127.0.0.1:29500");
  EXPECT_EQ(c.transport, "tcp");
  EXPECT_EQ(c.topology, "double_binary");
  EXPECT_EQ(c.chunk_bytes, 4u << 20);
  EXPECT_EQ(c.timeouts.heartbeat, 500ms);
  EXPECT_EQ(c.timeouts.refit, 120s);
  EXPECT_EQ(c.timeouts.join, 120s);
  EXPECT_EQ(c.timeouts.producer_loss, 60s);
  EXPECT_EQ(c.retain_versions, 4u);
  EXPECT_EQ(c.trainer.params, 50'000'000u);
  EXPECT_EQ(c.trainer.steps, 3);
  EXPECT_DOUBLE_EQ(c.trainer.lr, 2e-6);
  EXPECT_EQ(c.trainer.seed, 42u);
  const auto members = member_list(c);
  ASSERT_EQ(members.size(), 8u);
  EXPECT_EQ(members[0].url, "tcp://127.0.0.1:29501");
  EXPECT_EQ(members[7].url, "tcp://127.0.0.1:29508");
  EXPECT_EQ(members[7].cluster, "local");
}

TEST(Config, ExplicitMembersWithClusters) {
  const Config c = parse_config(R"(producer: tcp://10.0.0.1:29500
members:
  - {rank: 1, host: b, cluster: eu, port: 7001}
  - {rank: 0, host: a, cluster: us, url: "ofi+tcp://10.0.0.2:7000"}
)",
                                "m.yaml");
  validate(c);
  const auto members = member_list(c);
  ASSERT_EQ(members.size(), 2u);
  EXPECT_EQ(members[0].url, "ofi+tcp://10.0.0.2:7000");
  EXPECT_EQ(members[1].url, "tcp://b:7001");
  EXPECT_EQ(members[1].cluster, "eu");
}

TEST(Config, DefaultsWhenKeysAreAbsent) {
  const Config c = parse_config("producer: tcp://127.0.0.1:1\nmembers: {count: 2}\n", "d.yaml");
  EXPECT_EQ(c.topology, "double_binary");
  EXPECT_EQ(c.chunk_bytes, 4u << 20);
  EXPECT_EQ(c.log_level, "info");
  EXPECT_EQ(member_list(c)[1].url, "tcp://127.0.0.1:29502");
}

// producers: M: rank g >= 1 listens on the producer's port + g; a member on one of those ports, a
// producer URL without a port and a count out of range are refused.
TEST(Config, ProducerGroup) {
  const std::string base =
      "producer: tcp://127.0.0.1:29500\nmembers:\n  count: 3\n  host: 127.0.0.1\n  base_port: 29510\n";
  Config one = parse_config(base, "test.yaml");
  EXPECT_EQ(one.producers, 1u);
  EXPECT_EQ(producer_rank_urls(one), std::vector<std::string>{"tcp://127.0.0.1:29500"});
  Config three = parse_config(base + "producers: 3\n", "test.yaml");
  validate(three);
  EXPECT_EQ(producer_rank_urls(three),
            (std::vector<std::string>{"tcp://127.0.0.1:29500", "tcp://127.0.0.1:29501", "tcp://127.0.0.1:29502"}));
  EXPECT_TRUE(contains(parse_error(base + "producers: 0\n"), "producers"));
  EXPECT_TRUE(contains(parse_error(base + "producers: 2000\n"), "producers"));
  Config clash = parse_config(
      "producer: tcp://127.0.0.1:29500\nproducers: 4\nmembers:\n  count: 3\n  host: 127.0.0.1\n  base_port: 29503\n",
      "test.yaml");
  try {
    validate(clash);
    ADD_FAILURE() << "a member on producer rank 3's port was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "producer rank 3")) << e.what();
  }
  Config no_port = parse_config("producer: tcp://somehost\nproducers: 2\nmembers:\n  count: 1\n", "test.yaml");
  EXPECT_THROW(producer_rank_urls(no_port), Error);
}

TEST(Config, RepairKeysDefaults) {
  const Config c = parse_config("producer: tcp://127.0.0.1:1\nmembers: {count: 2}\n", "d.yaml");
  EXPECT_EQ(c.retain_versions, 4u);
  EXPECT_EQ(c.timeouts.join, 120s);
  EXPECT_EQ(c.timeouts.producer_loss, 60s);
  EXPECT_EQ(c.output.dir, "deltacast-out");
  EXPECT_EQ(c.output.log_file, "");
}

TEST(Config, RepairKeysParse) {
  const Config c = parse_config(R"(producer: tcp://127.0.0.1:1
retain_versions: 16
members: {count: 2}
timeouts: {connect: 2s, join: 5m, producer_loss: 90s}
output: {dir: runs/x, log_file: runs/x/run.log}
)",
                                "r.yaml");
  validate(c);
  EXPECT_EQ(c.retain_versions, 16u);
  EXPECT_EQ(c.timeouts.connect, 2s);
  EXPECT_EQ(c.timeouts.join, 300s);
  EXPECT_EQ(c.timeouts.producer_loss, 90s);
  EXPECT_EQ(c.output.log_file, "runs/x/run.log");
  EXPECT_EQ(parse_config("retain_versions: 0\n", "z.yaml").retain_versions, 0u);
  EXPECT_EQ(parse_config("retain_versions: 1024\n", "z.yaml").retain_versions, 1024u);
}

TEST(Config, WatchTrainerAndAllowInsecure) {
  const Config c = parse_config(R"(producer: tcp://127.0.0.1:1
members: {count: 2}
allow_insecure: true
trainer: {kind: watch, dir: /ckpt/run-42, steps: 0}
)",
                                "w.yaml");
  validate(c);
  EXPECT_TRUE(c.allow_insecure);
  EXPECT_EQ(c.trainer.kind, "watch");
  EXPECT_EQ(c.trainer.dir, "/ckpt/run-42");
  EXPECT_EQ(c.trainer.steps, 0);
  EXPECT_EQ(c.trainer.read, "pread");
  EXPECT_EQ(parse_config("trainer: {kind: watch, dir: /c, read: map}\n", "r.yaml").trainer.read, "map");
  std::string bad_read = parse_error("trainer:\n  read: mmap\n");
  EXPECT_TRUE(contains(bad_read, "test.yaml:2:9: key 'trainer.read': unknown value 'mmap'")) << bad_read;
  EXPECT_FALSE(parse_config("producer: tcp://127.0.0.1:1\n", "d.yaml").allow_insecure);
  std::string m = parse_error("allow_insecure: maybe\n");
  EXPECT_TRUE(contains(m, "test.yaml:1:17: key 'allow_insecure': expected true or false")) << m;
  // steps 0 is for watch only; watch needs its directory.
  Config synth = parse_config("producer: tcp://127.0.0.1:1\nmembers: {count: 1}\ntrainer: {steps: 0}\n", "s.yaml");
  EXPECT_THROW(validate(synth), Error);
  Config nodir = parse_config("producer: tcp://127.0.0.1:1\nmembers: {count: 1}\ntrainer: {kind: watch}\n", "n.yaml");
  try {
    validate(nodir);
    FAIL() << "watch without a directory was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "trainer.dir")) << e.what();
  }
}

TEST(ConfigErrors, BadRepairKeysNameLineAndColumn) {
  std::string m = parse_error("producer: tcp://h:1\nretain_versions: 1025\n");
  EXPECT_TRUE(contains(m, "test.yaml:2:18: key 'retain_versions': must be between 0 and 1024, got 1025")) << m;
  m = parse_error("retain_versions: -1\n");
  EXPECT_TRUE(contains(m, "test.yaml:1:18: key 'retain_versions'")) << m;
  m = parse_error("retain_versions: four\n");
  EXPECT_TRUE(contains(m, "test.yaml:1:18: key 'retain_versions': expected an integer")) << m;
  m = parse_error("timeouts:\n  connect: 5s\n  join: 2\n");
  EXPECT_TRUE(contains(m, "test.yaml:3:9: key 'timeouts.join'")) << m;
  EXPECT_TRUE(contains(m, "a unit is required")) << m;
  m = parse_error("timeouts:\n  producer_loss: 0s\n");
  EXPECT_TRUE(contains(m, "test.yaml:2:18: key 'timeouts.producer_loss': must be positive")) << m;
  m = parse_error("timeouts: {producer_loss: -5s}\n");
  EXPECT_TRUE(contains(m, "test.yaml:1:27: key 'timeouts.producer_loss'")) << m;
  EXPECT_TRUE(contains(m, "negative")) << m;
  m = parse_error("timeouts:\n  producer-loss: 5s\n");
  EXPECT_TRUE(contains(m, "test.yaml:2:3: unknown key 'timeouts.producer-loss'")) << m;
  EXPECT_TRUE(contains(m, "producer_loss")) << m;
  m = parse_error("output:\n  log_file: logs/\n");
  EXPECT_TRUE(contains(m, "test.yaml:2:13: key 'output.log_file': must name a file")) << m;
}

TEST(Config, CheckpointDirAndKeep) {
  const Config c = parse_config("producer: tcp://127.0.0.1:1\nmembers: {count: 2}\n"
                                "output:\n  checkpoint_dir: /serve/w-{rank}\n  keep: 3\n",
                                "k.yaml");
  validate(c);
  EXPECT_EQ(c.output.checkpoint_dir, "/serve/w-{rank}");
  EXPECT_EQ(c.output.keep, 3u);
  EXPECT_EQ(checkpoint_dir_for_rank(c.output.checkpoint_dir, 4), "/serve/w-4");
  EXPECT_EQ(checkpoint_dir_for_rank("{rank}/a/{rank}", 12), "12/a/12");
  EXPECT_EQ(checkpoint_dir_for_rank("/plain", 3), "/plain");
  const Config d = parse_config("producer: tcp://127.0.0.1:1\n", "d.yaml");
  EXPECT_EQ(d.output.checkpoint_dir, "");
  EXPECT_EQ(d.output.keep, 2u);
  const std::string m = parse_error("output:\n  keep: 0\n");
  EXPECT_TRUE(contains(m, "test.yaml:2:9: key 'output.keep': must be between 1 and")) << m;
}

TEST(ConfigValues, LogFileForRank) {
  EXPECT_EQ(log_file_for_rank("run.log", 3), "run.rank3.log");
  EXPECT_EQ(log_file_for_rank("runs/today/run.log", 0), "runs/today/run.rank0.log");
  EXPECT_EQ(log_file_for_rank("/var/log/deltacast", 12), "/var/log/deltacast.rank12");
  EXPECT_EQ(log_file_for_rank("a.b/run.tar.log", 1), "a.b/run.tar.rank1.log");
  EXPECT_EQ(log_file_for_rank(".log", 2), ".log.rank2");
  EXPECT_EQ(log_file_for_rank("a.b/run", 2), "a.b/run.rank2");
  EXPECT_EQ(log_file_for_rank("", 2), "");
}

TEST(ConfigErrors, UnknownKeyNamesLineAndColumn) {
  const std::string m = parse_error("producer: tcp://h:1\ntransport: tcp\nchunk_size: 4MiB\n");
  EXPECT_TRUE(contains(m, "test.yaml:3:1: unknown key 'chunk_size'")) << m;
}

TEST(ConfigErrors, UnknownNestedKey) {
  const std::string m = parse_error("timeouts:\n  connect: 5s\n  hartbeat: 1s\n");
  EXPECT_TRUE(contains(m, "test.yaml:3:3: unknown key 'timeouts.hartbeat'")) << m;
}

TEST(ConfigErrors, WrongType) {
  std::string m = parse_error("trainer:\n  steps: three\n");
  EXPECT_TRUE(contains(m, "test.yaml:2:10: key 'trainer.steps': expected an integer")) << m;
  m = parse_error("timeouts: 5s\n");
  EXPECT_TRUE(contains(m, "test.yaml:1:11: key 'timeouts' expects a mapping")) << m;
  m = parse_error("producer:\n  - a\n");
  EXPECT_TRUE(contains(m, "test.yaml:2:3: key 'producer' expects a single value")) << m;
}

TEST(ConfigErrors, NegativeAndZeroSizes) {
  std::string m = parse_error("transport: tcp\nchunk_bytes: -4MiB\n");
  EXPECT_TRUE(contains(m, "test.yaml:2:14: key 'chunk_bytes'")) << m;
  EXPECT_TRUE(contains(m, "negative")) << m;
  m = parse_error("\n\nchunk_bytes: 0\n");
  EXPECT_TRUE(contains(m, "test.yaml:3:14:")) << m;
  m = parse_error("trainer: {params: 12 parsecs}\n");
  EXPECT_TRUE(contains(m, "test.yaml:1:19:")) << m;
  EXPECT_TRUE(contains(m, "unknown unit")) << m;
}

TEST(ConfigErrors, BadTopologyName) {
  const std::string m = parse_error("producer: tcp://h:1\n\ntopology: ring\n");
  EXPECT_TRUE(contains(m, "test.yaml:3:11: key 'topology': unknown value 'ring'")) << m;
  EXPECT_TRUE(contains(m, "double_binary")) << m;
}

TEST(ConfigErrors, MalformedYaml) {
  std::string m = parse_error("producer: tcp://h:1\ntrainer: {steps: 3\n");
  EXPECT_TRUE(contains(m, "test.yaml:")) << m;
  EXPECT_TRUE(contains(m, "malformed YAML")) << m;
  m = parse_error("a: b\n  c: d\n");
  EXPECT_TRUE(contains(m, "test.yaml:2:")) << m;
  EXPECT_TRUE(contains(m, "malformed YAML")) << m;
}

TEST(ConfigErrors, DuplicateKey) {
  const std::string m = parse_error("topology: chain\ntopology: binary\n");
  EXPECT_TRUE(contains(m, "test.yaml:2:1: duplicate key 'topology'")) << m;
}

TEST(ConfigErrors, BadMembers) {
  std::string m = parse_error("members:\n  - {host: a, port: 1}\n");
  EXPECT_TRUE(contains(m, "test.yaml:2:5: member entry needs a 'rank'")) << m;
  m = parse_error("members:\n  - {rank: 0, host: a, port: 70000}\n");
  EXPECT_TRUE(contains(m, "test.yaml:2:30: key 'members[].port': must be between 1 and 65535")) << m;
  m = parse_error("members: {base_port: 9000}\n");
  EXPECT_TRUE(contains(m, "needs 'count'")) << m;
  // ranks must be 0..n-1 each once
  Config c = parse_config("producer: tcp://h:1\nmembers:\n  - {rank: 0, url: 'tcp://a:1'}\n  - {rank: 2, url: 'tcp://b:1'}\n",
                          "gap.yaml");
  try {
    validate(c);
    FAIL() << "rank gap accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "rank 1 is missing")) << e.what();
  }
}

TEST(ConfigErrors, MissingFileAndMissingProducer) {
  try {
    load_config("/nonexistent/deltacast.yaml", no_env());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::config);
    EXPECT_TRUE(contains(e.what(), "/nonexistent/deltacast.yaml")) << e.what();
  }
  const Config c = parse_config("members: {count: 2}\n", "p.yaml");
  EXPECT_THROW(validate(c), Error);
}

class ConfigOverrides : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = std::filesystem::temp_directory_path() / ("deltacast-config-" + std::to_string(::getpid()) + ".yaml");
    std::ofstream(path_) << "producer: tcp://127.0.0.1:29500\ntopology: binary\nchunk_bytes: 1MiB\nmembers: {count: 4}\n";
  }
  void TearDown() override { std::filesystem::remove(path_); }
  std::filesystem::path path_;
};

TEST_F(ConfigOverrides, EnvBeatsFileAndFlagsBeatEnv) {
  const auto env = env_of({{"DELTACAST_CHUNK_BYTES", "8MiB"},
                           {"DELTACAST_TOPOLOGY", "chain"},
                           {"DELTACAST_TRANSPORT", "ofi+tcp"},
                           {"DELTACAST_PRODUCER", "ofi+tcp://127.0.0.1:3000"},
                           {"DELTACAST_TIMEOUTS_PEER", "30s"},
                           {"DELTACAST_MEMBERS_COUNT", "6"}});
  Config c = load_config(path_.string(), env);
  EXPECT_EQ(c.chunk_bytes, 8u << 20);
  EXPECT_EQ(c.topology, "chain");
  EXPECT_EQ(c.transport, "ofi+tcp");
  EXPECT_EQ(c.producer, "ofi+tcp://127.0.0.1:3000");
  EXPECT_EQ(c.timeouts.peer, 30s);
  ASSERT_EQ(member_list(c).size(), 6u);
  EXPECT_EQ(member_list(c)[0].url, "ofi+tcp://127.0.0.1:29501");  // the transport override applies
  apply_flag_overrides(c, {"chunk_bytes=500K", "topology=double_binary"});
  EXPECT_EQ(c.chunk_bytes, 500'000u);
  EXPECT_EQ(c.topology, "double_binary");
  // Unset env leaves the file's values.
  const Config plain = load_config(path_.string(), no_env());
  EXPECT_EQ(plain.chunk_bytes, 1u << 20);
  EXPECT_EQ(plain.topology, "binary");
}

TEST_F(ConfigOverrides, RepairKeysFromEnvAndFlags) {
  Config c = load_config(path_.string(), env_of({{"DELTACAST_RETAIN_VERSIONS", "0"},
                                                 {"DELTACAST_TIMEOUTS_JOIN", "3m"},
                                                 {"DELTACAST_TIMEOUTS_PRODUCER_LOSS", "2500ms"},
                                                 {"DELTACAST_OUTPUT_LOG_FILE", "logs/run.log"}}));
  EXPECT_EQ(c.retain_versions, 0u);
  EXPECT_EQ(c.timeouts.join, 180s);
  EXPECT_EQ(c.timeouts.producer_loss, 2500ms);
  EXPECT_EQ(c.output.log_file, "logs/run.log");
  apply_flag_overrides(c, {"retain_versions=7", "timeouts.join=10s", "timeouts.producer_loss=1h"});
  EXPECT_EQ(c.retain_versions, 7u);
  EXPECT_EQ(c.timeouts.join, 10s);
  EXPECT_EQ(c.timeouts.producer_loss, 3600s);
  try {
    load_config(path_.string(), env_of({{"DELTACAST_TIMEOUTS_JOIN", "soon"}}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "env DELTACAST_TIMEOUTS_JOIN: key 'timeouts.join': bad duration 'soon'"))
        << e.what();
  }
  try {
    load_config(path_.string(), env_of({{"DELTACAST_RETAIN_VERSIONS", "2000"}}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "env DELTACAST_RETAIN_VERSIONS: key 'retain_versions': must be between 0 and 1024"))
        << e.what();
  }
  const auto& keys = overridable_keys();
  for (const char* key : {"retain_versions", "timeouts.join", "timeouts.producer_loss"})
    EXPECT_NE(std::find(keys.begin(), keys.end(), key), keys.end()) << key;
}

TEST_F(ConfigOverrides, BadEnvAndFlagValuesNameTheirSource) {
  try {
    load_config(path_.string(), env_of({{"DELTACAST_TOPOLOGY", "star"}}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "env DELTACAST_TOPOLOGY: key 'topology': unknown value 'star'")) << e.what();
  }
  Config c = load_config(path_.string(), no_env());
  try {
    apply_flag_overrides(c, {"chunk_bytes=-1"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "flag --set chunk_bytes: key 'chunk_bytes'")) << e.what();
  }
  EXPECT_THROW(apply_flag_overrides(c, {"no_such_key=1"}), Error);
  EXPECT_THROW(apply_flag_overrides(c, {"chunk_bytes"}), Error);
}

TEST(ConfigValues, Sizes) {
  EXPECT_EQ(parse_size("4096"), 4096u);
  EXPECT_EQ(parse_size("4MiB"), 4u << 20);
  EXPECT_EQ(parse_size("1GiB"), 1u << 30);
  EXPECT_EQ(parse_size("1.5GiB"), 3u << 29);
  EXPECT_EQ(parse_size("500M"), 500'000'000u);
  EXPECT_EQ(parse_size("4MB"), 4'000'000u);
  EXPECT_EQ(parse_size("2T"), 2'000'000'000'000u);
  EXPECT_EQ(parse_size("18446744073709551615"), UINT64_MAX);
  for (const char* bad : {"", "-1", "MiB", "4 MiB", "4XB", "1.0000001K", "18446744073709551616", "16EiB"}) {
    EXPECT_THROW(parse_size(bad), Error) << bad;
  }
}

TEST(ConfigValues, Durations) {
  EXPECT_EQ(parse_duration("500ms"), 500ms);
  EXPECT_EQ(parse_duration("5s"), 5s);
  EXPECT_EQ(parse_duration("2m"), 120s);
  EXPECT_EQ(parse_duration("1h"), 3600s);
  for (const char* bad : {"", "5", "-5s", "5 s", "5d", "1.5s"}) EXPECT_THROW(parse_duration(bad), Error) << bad;
}

TEST(ConfigValues, Rates) {
  EXPECT_EQ(parse_rate("100Mbit/s"), 12'500'000u);
  EXPECT_EQ(parse_rate("100Mbit"), 12'500'000u);
  EXPECT_EQ(parse_rate("100Mbps"), 12'500'000u);
  EXPECT_EQ(parse_rate("2.5Gbit/s"), 312'500'000u);
  EXPECT_EQ(parse_rate("10Gbps"), 1'250'000'000u);
  EXPECT_EQ(parse_rate("8bit/s"), 1u);
  EXPECT_EQ(parse_rate("125MB/s"), 125'000'000u);
  EXPECT_EQ(parse_rate("1MiB/s"), 1'048'576u);
  EXPECT_EQ(parse_rate("64KiB/s"), 65'536u);
  EXPECT_EQ(parse_rate("0"), 0u);
  EXPECT_EQ(parse_rate("unlimited"), 0u);
  for (const char* bad : {"", "100", "-1Mbit/s", "1.5", "100Mbit/h", "3bit/s", "fast", "1e3Mbit/s", "0Mbit/s"}) {
    EXPECT_THROW(parse_rate(bad), Error) << bad;
  }
  try {
    parse_rate("100");
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "a unit is required")) << e.what();
  }
}

TEST(Config, EgressCapsForTheProducerTheMembersAndOneMember) {
  const Config c = parse_config(
      "producer: tcp://127.0.0.1:1\n"
      "egress: {producer: 100Mbit/s, members: 1Gbit/s, burst: 256KiB}\n"
      "members:\n"
      "  - {rank: 0, url: tcp://127.0.0.1:2}\n"
      "  - {rank: 1, url: tcp://127.0.0.1:3, egress: 50MB/s}\n",
      "e.yaml");
  validate(c);
  EXPECT_EQ(c.egress.producer, 12'500'000u);
  EXPECT_EQ(c.egress.members, 125'000'000u);
  EXPECT_EQ(c.egress.burst, 256u * 1024);
  const auto members = member_list(c);
  EXPECT_FALSE(members[0].egress.has_value());
  EXPECT_EQ(members[1].egress, 50'000'000u);
  const Config d = parse_config("producer: tcp://127.0.0.1:1\nmembers: {count: 2}\n", "d.yaml");
  EXPECT_EQ(d.egress.producer, 0u);
  EXPECT_EQ(d.egress.members, 0u);
  std::string m = parse_error("egress:\n  producer: 100\n");
  EXPECT_TRUE(contains(m, "test.yaml:2:13: key 'egress.producer': bad rate '100': a unit is required")) << m;
  m = parse_error("members:\n  - {rank: 0, url: tcp://h:1, egress: 9Mbit/fortnight}\n");
  EXPECT_TRUE(contains(m, "test.yaml:2:39: key 'members[].egress': bad rate")) << m;
  m = parse_error("egress: {uplink: 1Gbit/s}\n");
  EXPECT_TRUE(contains(m, "unknown key 'egress.uplink'")) << m;
}

TEST(Config, CommitIsDelegatedWhenAskedOrWhenTheProducerIsAcrossABoundary) {
  const std::string members =
      "members:\n"
      "  - {rank: 0, url: tcp://127.0.0.1:2, cluster: rollout}\n"
      "  - {rank: 1, url: tcp://127.0.0.1:3, cluster: rollout}\n";
  auto with = [&](const std::string& extra) {
    return parse_config("producer: tcp://127.0.0.1:1\n" + extra + members, "c.yaml");
  };
  EXPECT_EQ(with("").commit, "auto");
  EXPECT_FALSE(commit_is_delegated(with(""))) << "auto without a producer cluster";
  EXPECT_TRUE(commit_is_delegated(with("producer_cluster: trainer\n")));
  EXPECT_FALSE(commit_is_delegated(with("producer_cluster: rollout\n"))) << "a member shares its cluster";
  EXPECT_FALSE(commit_is_delegated(with("producer_cluster: trainer\ncommit: producer\n")));
  EXPECT_TRUE(commit_is_delegated(with("commit: delegated\n")));
  // The shorthand's cluster counts too.
  const Config local =
      parse_config("producer: tcp://127.0.0.1:1\nproducer_cluster: a\nmembers: {count: 2, cluster: a}\n", "l.yaml");
  EXPECT_FALSE(commit_is_delegated(local));
  // After a probe (`deltacast probe` predicts with the commit `run` would use): with clusters: auto
  // the found clusters decide; with manual clusters the config's labels do.
  Config probed =
      parse_config("producer: tcp://127.0.0.1:1\nclusters: auto\nmembers: {count: 3, cluster: a}\n", "p.yaml");
  EXPECT_TRUE(commit_is_delegated(probed, {{0}, {1, 2, 3}})) << "the producer alone in its cluster";
  EXPECT_FALSE(commit_is_delegated(probed)) << "the caller's config is not changed";
  EXPECT_FALSE(commit_is_delegated(probed, {{0, 1}, {2, 3}})) << "a member in the producer's cluster";
  EXPECT_THROW(commit_is_delegated(probed, {{0, 7}}), Error);
  EXPECT_FALSE(commit_is_delegated(local, {{0}, {1, 2}})) << "clusters: manual keeps its labels";
  const std::string m = parse_error("producer: tcp://h:1\ncommit: rollout\n");
  EXPECT_TRUE(contains(m, "test.yaml:2:9: key 'commit': unknown value 'rollout'")) << m;
}

TEST(Config, ClustersAutoTakesTheProbesClustersAndTheProducersOwn) {
  const std::string dir = testing::TempDir();
  const std::string probe = dir + "/probe-" + std::to_string(::getpid()) + ".json";
  std::ofstream(probe) << R"({"ranks": 5, "clusters": [[0, 1, 2], [3]], "unreachable": [4]})";
  Config c = parse_config(
      "producer: tcp://127.0.0.1:1\nmembers: {count: 4, cluster: lab}\n"
      "clusters: auto\nprobe_file: " +
          probe + "\n",
      "a.yaml");
  validate(c);
  resolve_clusters(c);
  EXPECT_FALSE(c.local_members.has_value());
  const auto members = member_list(c);
  ASSERT_EQ(members.size(), 4u);
  EXPECT_EQ(members[0].cluster, "probe-0");  // job rank 1
  EXPECT_EQ(members[1].cluster, "probe-0");
  EXPECT_EQ(members[2].cluster, "probe-1");
  EXPECT_EQ(members[3].cluster, "lab");  // job rank 4: not reached by the probe, keeps its own
  EXPECT_EQ(members[3].url, "tcp://127.0.0.1:29504");
  EXPECT_EQ(c.producer_cluster, "probe-0");
  // Another job size, a broken file, a missing file, and auto without a file are refused.
  std::ofstream(probe) << R"({"ranks": 9, "clusters": [[0]]})";
  Config d = c;
  d.members.clear();
  d.local_members = LocalMembers{4, "127.0.0.1", 29501, "lab"};
  try {
    resolve_clusters(d);
    ADD_FAILURE() << "a probe of another job size was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "measured 9 ranks, but this job has 5")) << e.what();
  }
  std::ofstream(probe) << "not json";
  EXPECT_THROW(resolve_clusters(d), Error);
  d.probe_file = dir + "/no-such-probe.json";
  EXPECT_THROW(resolve_clusters(d), Error);
  // Without a probe_file the CLI probes at start: the config is valid and keeps its labels until then.
  Config e = parse_config("producer: tcp://127.0.0.1:1\nmembers: {count: 2, cluster: x}\nclusters: auto\n", "e.yaml");
  validate(e);
  resolve_clusters(e);
  EXPECT_EQ(member_list(e)[0].cluster, "x");
  apply_probe_clusters(e, {{0, 2}, {1}}, "a quick probe");
  EXPECT_EQ(e.producer_cluster, "probe-0");
  EXPECT_EQ(member_list(e)[0].cluster, "probe-1");
  EXPECT_EQ(member_list(e)[1].cluster, "probe-0");
  try {
    apply_probe_clusters(e, {{0, 3}}, "a quick probe");
    ADD_FAILURE() << "a rank outside the job was accepted";
  } catch (const Error& err) {
    EXPECT_TRUE(contains(err.what(), "a quick probe: cluster 0 names a rank outside 0..2")) << err.what();
  }
  std::remove(probe.c_str());
}

// The pieces the C API uses (it has no member list: its job size is the producer's "receivers" + 1,
// and a receiver knows only its own rank).
TEST(Config, ProbeClustersAreReadForAnyJobSizeAndLabelled) {
  const std::string probe = testing::TempDir() + "/probe-read-" + std::to_string(::getpid()) + ".json";
  std::ofstream(probe) << R"({"ranks": 4, "clusters": [[0], [1, 3]], "unreachable": [2]})";
  const auto clusters = read_probe_clusters(probe, 0);
  ASSERT_EQ(clusters, (std::vector<std::vector<int>>{{0}, {1, 3}}));
  EXPECT_EQ(read_probe_clusters(probe, 4), clusters);
  EXPECT_EQ(probe_cluster_label(clusters, 0), "probe-0");
  EXPECT_EQ(probe_cluster_label(clusters, 3), "probe-1");
  EXPECT_EQ(probe_cluster_label(clusters, 2), "") << "a rank the probe did not reach has no label";
  EXPECT_EQ(probe_cluster_label(clusters, 9), "");
  auto refused = [&](const std::string& text, size_t job_size) {
    std::ofstream(probe) << text;
    try {
      read_probe_clusters(probe, job_size);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::config);
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_TRUE(contains(refused(R"({"ranks": 4, "clusters": [[0]]})", 5), "measured 4 ranks, but this job has 5"));
  EXPECT_TRUE(contains(refused(R"({"clusters": [[0]]})", 0), "no rank count"));
  EXPECT_TRUE(contains(refused(R"({"ranks": 3, "clusters": [[0, 3]]})", 0), "cluster 0 names a rank outside 0..2"));
  EXPECT_TRUE(contains(refused(R"({"ranks": 3, "clusters": [[0, -1]]})", 0), "names a rank outside"));
  EXPECT_TRUE(contains(refused(R"({"ranks": 3, "clusters": [0]})", 0), "cluster 0 is not a list"));
  EXPECT_TRUE(contains(refused("[1, 2]", 0), "not a `deltacast probe` report"));
  std::remove(probe.c_str());
  EXPECT_TRUE(contains(refused("", 0), "not a `deltacast probe` report"));
  std::remove(probe.c_str());
  try {
    read_probe_clusters(probe, 0);
    ADD_FAILURE() << "a missing file was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "cannot open")) << e.what();
  }
}

TEST(Config, StoreSectionRoutesItsClustersThroughGateways) {
  const std::string members =
      "producer: tcp://127.0.0.1:1\n"
      "producer_cluster: train\n"
      "members:\n"
      "  - {rank: 0, url: tcp://127.0.0.1:2, cluster: train}\n"
      "  - {rank: 1, url: tcp://127.0.0.1:3, cluster: east}\n"
      "  - {rank: 2, url: tcp://127.0.0.1:4, cluster: train}\n"
      "  - {rank: 3, url: tcp://127.0.0.1:5, cluster: east}\n"
      "  - {rank: 4, url: tcp://127.0.0.1:6, cluster: west}\n"
      "  - {rank: 5, url: tcp://127.0.0.1:7, cluster: east}\n";
  const Config c = parse_config(members +
                                    "store:\n"
                                    "  endpoint: https://s3.example.com\n"
                                    "  region: eu-west-1\n"
                                    "  bucket: refits\n"
                                    "  prefix: runs/42\n"
                                    "  addressing: virtual\n"
                                    "  part_bytes: 8MiB\n"
                                    "  parallel: 8\n"
                                    "  retain_versions: 6\n"
                                    "  snapshot_every: 10\n"
                                    "  inline_bytes: 1MiB\n"
                                    "  poll: 50ms\n"
                                    "  clusters: [east, west]\n",
                                "s.yaml");
  validate(c);
  EXPECT_TRUE(c.store.enabled());
  EXPECT_EQ(c.store.endpoint, "https://s3.example.com");
  EXPECT_EQ(c.store.region, "eu-west-1");
  EXPECT_EQ(c.store.bucket, "refits");
  EXPECT_EQ(c.store.prefix, "runs/42");
  EXPECT_EQ(c.store.addressing, "virtual");
  EXPECT_EQ(c.store.part_bytes, 8u << 20);
  EXPECT_EQ(c.store.parallel, 8u);
  EXPECT_EQ(c.store.retain_versions, 6u);
  EXPECT_EQ(c.store.snapshot_every, 10u);
  EXPECT_EQ(c.store.inline_bytes, 1u << 20);
  EXPECT_EQ(c.store.poll, 50ms);
  EXPECT_EQ(c.store.clusters, (std::vector<std::string>{"east", "west"}));
  // Members 0 and 2 are the producer's tree (ranks 1, 2); east's gateway is member 1 (the lowest
  // rank), members 3 and 5 its tree's ranks 1 and 2; west's only member is its gateway.
  using Kind = VersionRoute::Kind;
  EXPECT_EQ(producer_tree_members(c), 2u);
  EXPECT_EQ(version_route(c, 0).kind, Kind::producer);
  EXPECT_EQ(version_route(c, 0).tree_rank, 1u);
  EXPECT_EQ(version_route(c, 2).tree_rank, 2u);
  const VersionRoute east = version_route(c, 1);
  EXPECT_EQ(east.kind, Kind::gateway);
  EXPECT_EQ(east.gateway, 1);
  EXPECT_EQ(east.behind, (std::vector<int>{3, 5}));
  EXPECT_EQ(version_route(c, 3).kind, Kind::behind_gateway);
  EXPECT_EQ(version_route(c, 3).gateway, 1);
  EXPECT_EQ(version_route(c, 3).tree_rank, 1u);
  EXPECT_EQ(version_route(c, 5).tree_rank, 2u);
  EXPECT_EQ(version_route(c, 4).kind, Kind::gateway);
  EXPECT_TRUE(version_route(c, 4).behind.empty());
  EXPECT_THROW(version_route(c, 6), Error);
  // Without a store every member is the producer's, whatever its label.
  const Config plain = parse_config(members, "p.yaml");
  EXPECT_EQ(producer_tree_members(plain), 6u);
  EXPECT_EQ(version_route(plain, 5).tree_rank, 6u);
  // The list also comes as text (env, --set).
  Config flagged = plain;
  apply_flag_overrides(flagged,
                       {"store.endpoint=http://127.0.0.1:9000", "store.bucket=b", "store.clusters= west ,east"});
  validate(flagged);
  EXPECT_EQ(flagged.store.clusters, (std::vector<std::string>{"west", "east"}));
  EXPECT_EQ(producer_tree_members(flagged), 2u);

  std::string m = parse_error("store:\n  endpoint: s3.example.com\n");
  EXPECT_TRUE(contains(m, "test.yaml:2:13: key 'store.endpoint': must start with http:// or https://")) << m;
  m = parse_error("store:\n  part_bytes: 1MiB\n");
  EXPECT_TRUE(contains(m, "test.yaml:2:15: key 'store.part_bytes': must be between 5MiB and 5GiB")) << m;
  m = parse_error("store:\n  inline_bytes: 65MiB\n");
  EXPECT_TRUE(contains(m, "test.yaml:2:17: key 'store.inline_bytes': must be at most 64MiB")) << m;
  EXPECT_EQ(parse_config("store:\n  inline_bytes: 0\n", "z.yaml").store.inline_bytes, 0u);
  m = parse_error("store:\n  clusters: [east, {a: 1}]\n");
  EXPECT_TRUE(contains(m, "store.clusters' expects a list of cluster labels")) << m;
  m = parse_error("store:\n  addressing: dns\n");
  EXPECT_TRUE(contains(m, "test.yaml:2:15: key 'store.addressing': unknown value 'dns'")) << m;
  m = parse_error("store:\n  secret_key: x\n");
  EXPECT_TRUE(contains(m, "unknown key 'store.secret_key'")) << m;
  auto invalid = [&](const std::string& extra) {
    try {
      validate(parse_config(members + extra, "v.yaml"));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_TRUE(contains(invalid("store: {clusters: [east]}\n"), "store.endpoint is not set"));
  EXPECT_TRUE(contains(invalid("store: {endpoint: 'http://h:1'}\n"), "store.bucket is not"));
  EXPECT_TRUE(contains(invalid("store: {endpoint: 'http://h:1', bucket: b, clusters: [north]}\n"),
                       "'north', which no member carries"));
  EXPECT_TRUE(contains(invalid("store: {endpoint: 'http://h:1', bucket: b, clusters: [train]}\n"),
                       "the producer's own cluster"));
  Config group = parse_config(members + "producers: 2\nstore: {endpoint: 'http://h:1', bucket: b}\n", "g.yaml");
  group.producer = "tcp://127.0.0.1:100";
  try {
    validate(group);
    ADD_FAILURE() << "a producer group with a store was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "a producer group (producers: 2) cannot publish to the store")) << e.what();
  }
}

TEST(ConfigValues, EveryKeyRejectsControlCharacters) {
  // A stray \r (a Windows-edited env file) must fail at load time, not as a missing host later.
  Config c;
  for (const auto& key : overridable_keys()) {
    EXPECT_THROW(apply_override(c, key, "value\r", "probe"), Error) << key;
  }
  EXPECT_GE(overridable_keys().size(), 20u);
}

}  // namespace
}  // namespace deltacast::config
