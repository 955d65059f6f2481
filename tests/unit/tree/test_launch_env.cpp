// Launcher detection from injected environments (the real launchers run in
// tests/integration/launcher).
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "config/config.h"
#include "tree/launch_env.h"
#include "util/error.h"

namespace deltacast::tree {
namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

Errc error_code(const EnvLookup& env, const LaunchFlags& flags = {}) {
  try {
    detect_launch_env(env, flags);
  } catch (const Error& e) {
    return e.code();
  }
  return Errc::ok;
}

TEST(LaunchEnv, OpenMpi) {
  const auto e = detect_launch_env(
      env_of({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "9"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
              {"PMIX_RANK", "3"}}));
  EXPECT_EQ(e.launcher, Launcher::mpi);
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.size, 9);
  EXPECT_EQ(e.local_rank, 3);
  EXPECT_FALSE(e.is_producer());
  EXPECT_EQ(e.member_rank(), 2);
}

// A producer group (config producers: 3): ranks 0..2 produce, rank 3 is receiver 1 (member 0).
TEST(LaunchEnv, ProducerGroupRanks) {
  auto at = [](int rank) {
    auto e = detect_launch_env(env_of({{"OMPI_COMM_WORLD_RANK", std::to_string(rank)}, {"OMPI_COMM_WORLD_SIZE", "7"}}));
    e.producers = 3;
    return e;
  };
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(at(r).is_producer()) << r;
    EXPECT_THROW(at(r).member_rank(), Error) << r;
  }
  EXPECT_FALSE(at(3).is_producer());
  EXPECT_EQ(at(3).member_rank(), 0);
  EXPECT_EQ(at(3).receiver_rank(), 1);
  EXPECT_EQ(at(6).member_rank(), 3);
  EXPECT_EQ(at(6).receiver_rank(), 4);
}

// A job of a config: its producers set (rank 1 of 3 is a part rank), and a size other than
// producers + members refused naming both.
TEST(LaunchEnv, JobEnvTakesTheConfigsProducersAndChecksTheSize) {
  const auto c = config::parse_config(
      "producer: tcp://127.0.0.1:29500\nproducers: 3\nmembers: {count: 4, host: 127.0.0.1, base_port: 29510}\n",
      "job.yaml");
  auto at = [&](int rank, int size) {
    return detect_job_env(
        env_of({{"OMPI_COMM_WORLD_RANK", std::to_string(rank)}, {"OMPI_COMM_WORLD_SIZE", std::to_string(size)}}), {}, c,
        "job.yaml");
  };
  EXPECT_EQ(at(0, 7).producers, 3);
  EXPECT_EQ(at(0, 7).rendezvous, "tcp://127.0.0.1:29500");
  EXPECT_FALSE(at(0, 7).is_part_rank());
  EXPECT_TRUE(at(1, 7).is_part_rank());
  EXPECT_TRUE(at(2, 7).is_part_rank());
  EXPECT_FALSE(at(3, 7).is_part_rank());
  EXPECT_EQ(at(3, 7).receiver_rank(), 1);
  try {
    at(0, 5);
    FAIL() << "5 processes for 3 producer ranks + 4 receivers";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::config);
    EXPECT_NE(std::string(e.what()).find("the job has 5 processes but job.yaml lists 4 receivers (+3 producer ranks)"),
              std::string::npos)
        << e.what();
  }
}

TEST(LaunchEnv, SlurmWithNodelist) {
  const auto e = detect_launch_env(env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "9"}, {"SLURM_LOCALID", "0"},
                                           {"SLURM_STEP_NODELIST", "localhost"}}));
  EXPECT_EQ(e.launcher, Launcher::slurm);
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.size, 9);
  EXPECT_EQ(e.nodelist, "localhost");
  EXPECT_TRUE(e.is_producer());
  EXPECT_THROW(e.member_rank(), Error);
}

TEST(LaunchEnv, MpiWinsOverAnEnclosingSlurmAllocation) {
  const auto e = detect_launch_env(env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"},
                                           {"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "8"}}));
  EXPECT_EQ(e.launcher, Launcher::mpi);
  EXPECT_EQ(e.rank, 5);
}

TEST(LaunchEnv, PmixNeedsASize) {
  EXPECT_EQ(error_code(env_of({{"PMIX_RANK", "2"}})), Errc::invalid_argument);
  const auto e = detect_launch_env(env_of({{"PMIX_RANK", "2"}}), LaunchFlags{std::nullopt, 4, std::nullopt});
  EXPECT_EQ(e.launcher, Launcher::pmix);
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.size, 4);
}

TEST(LaunchEnv, FlagsWinOverTheEnvironment) {
  const auto e = detect_launch_env(env_of({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}}), LaunchFlags{2, 3, std::nullopt});
  EXPECT_EQ(e.launcher, Launcher::flags);
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.size, 3);
  EXPECT_EQ(detect_launch_env(env_of({}), LaunchFlags{0, 2, std::nullopt}).launcher, Launcher::flags);
}

TEST(LaunchEnv, RejectsMissingAndBadValues) {
  EXPECT_EQ(error_code(env_of({})), Errc::invalid_argument);                       // no launcher
  EXPECT_EQ(error_code(env_of({{"SLURM_PROCID", "x"}, {"SLURM_NTASKS", "4"}})), Errc::invalid_argument);
  EXPECT_EQ(error_code(env_of({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}})), Errc::invalid_argument);
  EXPECT_EQ(error_code(env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}})), Errc::invalid_argument);
  EXPECT_EQ(error_code(env_of({{"SLURM_PROCID", "0"}})), Errc::invalid_argument);  // no size
  EXPECT_EQ(error_code(env_of({{"OMPI_COMM_WORLD_RANK", "-1"}, {"OMPI_COMM_WORLD_SIZE", "4"}})), Errc::invalid_argument);
  EXPECT_EQ(error_code(env_of({}), LaunchFlags{0, std::nullopt, std::nullopt}), Errc::invalid_argument);
  try {
    detect_launch_env(env_of({{"SLURM_PROCID", "1x"}, {"SLURM_NTASKS", "4"}}));
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_PROCID='1x'"), std::string::npos) << e.what();
  }
}

TEST(LaunchEnv, RendezvousPrecedence) {
  const auto slurm = std::map<std::string, std::string>{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}};
  EXPECT_EQ(detect_launch_env(env_of(slurm), {}, "tcp://cfg:1").rendezvous, "tcp://cfg:1");
  auto with_env = slurm;
  with_env["DELTACAST_PRODUCER"] = "tcp://env:1";
  EXPECT_EQ(detect_launch_env(env_of(with_env), {}, "tcp://cfg:1").rendezvous, "tcp://env:1");
  EXPECT_EQ(detect_launch_env(env_of(with_env), LaunchFlags{std::nullopt, std::nullopt, "tcp://flag:1"}, "tcp://cfg:1")
                .rendezvous,
            "tcp://flag:1");
  const auto none = detect_launch_env(env_of(slurm));
  EXPECT_TRUE(none.rendezvous.empty());
  try {
    none.require_rendezvous();
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::config);
  }
}

}  // namespace
}  // namespace deltacast::tree
