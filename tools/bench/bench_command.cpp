// `deltacast bench link`: point-to-point throughput of one transport between two processes on
// 127.0.0.1. The command re-executes itself as the receiving server (hidden --role server), hands
// it a fresh random shared secret through DELTACAST_SECRET (never on the command line), connects,
// streams --size bytes as --message-size messages with --window sends in flight, and stops the
// clock when the server acknowledges the last byte. Connection setup is not timed.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "tools/bench/tree.h"
#include "tools/cli.h"
#include "transport/transport.h"
#include "util/error.h"

extern char** environ;

namespace deltacast::tools::bench_command {  // its own namespace: unity builds batch the commands together
namespace {

using namespace std::chrono_literals;
using transport::Connection;
using transport::Request;

struct LinkOptions {
  std::string scheme = "tcp";
  std::string size_text = "1GiB";
  std::string message_text = "8MiB";
  int window = 4;
  std::string egress_text = "0";  // the client's egress cap (a rate; 0 = none)
  std::string burst_text = "0";   // its bucket depth (0 = default)
  bool json = false;
  std::string role = "client";
};

transport::TransportOptions bench_transport_options(size_t message_bytes) {
  transport::TransportOptions options;
  options.secret = transport::load_secret();
  options.max_message_bytes = std::max<size_t>(message_bytes, 1 << 20);
  return options;
}

// Server role: prints its URL on stdout, receives `total` bytes, acknowledges with the count.
void run_server(const LinkOptions& o, uint64_t total, size_t message_bytes) {
  // Receive buffers are allocated (and their pages touched) before listening: the client's clock
  // starts at connect, and the raw tools do not pay for allocation inside their timed region.
  size_t window = static_cast<size_t>(o.window);
  std::vector<std::vector<std::byte>> buffers(window, std::vector<std::byte>(message_bytes));
  auto transport = transport::make_transport(o.scheme, bench_transport_options(message_bytes));
  auto listener =
      transport->listen(transport::Url::parse(o.scheme == "loop" ? "loop://bench" : o.scheme + "://127.0.0.1:0"));
  std::printf("%s\n", listener->local_url().str().c_str());
  std::fflush(stdout);
  auto connection = listener->accept(60s);
  if (!connection) throw Error(Errc::timeout, "bench server: no client connected within 60 s");
  uint64_t messages = (total + message_bytes - 1) / message_bytes;
  std::vector<std::shared_ptr<Request>> posted(window);
  uint64_t next_post = 0, received = 0;
  for (; next_post < std::min<uint64_t>(window, messages); ++next_post)
    posted[next_post % window] = connection->post_recv(buffers[next_post % window]);
  for (uint64_t k = 0; k < messages; ++k) {
    auto& request = posted[k % window];
    auto status = request->wait(120s);
    if (!status.ok()) throw Error(status);
    received += request->bytes();
    if (next_post < messages) {
      posted[next_post % window] = connection->post_recv(buffers[next_post % window]);
      ++next_post;
    }
  }
  auto ack = connection->post_send(std::as_bytes(std::span(&received, 1)));
  auto status = ack->wait(60s);
  if (!status.ok()) throw Error(status);
  // Wait for the client to hang up so the ack is not lost in a reset.
  uint64_t bye = 0;
  connection->post_recv(std::as_writable_bytes(std::span(&bye, 1)))->wait(30s);
}

pid_t spawn_server(const LinkOptions& o, int* stdout_fd, const std::string& secret) {
  int fds[2];
  if (::pipe(fds) != 0) throw Error(Errc::io, "bench: pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  std::vector<std::string> args = {
      "deltacast", "bench",     "link",           "--role",       "server",   "--transport",           o.scheme,
      "--size",    o.size_text, "--message-size", o.message_text, "--window", std::to_string(o.window)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings = {"DELTACAST_SECRET=" + secret};
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "DELTACAST_SECRET=", 17) != 0) env_strings.emplace_back(*e);
  }
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    throw Error(Errc::io, std::string("bench: cannot start the server process: ") + std::strerror(rc));
  }
  *stdout_fd = fds[0];
  return pid;
}

std::string read_line(int fd) {
  std::string line;
  char ch;
  while (::read(fd, &ch, 1) == 1 && ch != '\n') line += ch;
  return line;
}

void run_client(const LinkOptions& o, uint64_t total, size_t message_bytes) {
  std::string secret = transport::random_secret();
  ::setenv("DELTACAST_SECRET", secret.c_str(), 1);
  // Made before the server starts so an unbuilt scheme fails here with its own message. Only the
  // sending side is capped (egress).
  auto options = bench_transport_options(message_bytes);
  options.egress_bytes_per_second = config::parse_rate(o.egress_text);
  options.egress_burst_bytes = config::parse_size(o.burst_text);
  auto transport = transport::make_transport(o.scheme, options);
  int server_out = -1;
  pid_t server = spawn_server(o, &server_out, secret);
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == 0) {
        ::kill(pid, SIGTERM);
        ::waitpid(pid, &status, 0);
      }
    }
  } reaper{server};
  std::string url_text = read_line(server_out);
  ::close(server_out);
  if (url_text.empty()) throw Error(Errc::connection, "bench: the server process exited before listening");
  auto connection = transport->connect(transport::Url::parse(url_text), 30s);
  std::vector<std::byte> payload(message_bytes);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::byte>(i * 131 + 7);
  uint64_t acked = 0;
  auto ack = connection->post_recv(std::as_writable_bytes(std::span(&acked, 1)));
  size_t window = static_cast<size_t>(o.window);
  std::vector<std::shared_ptr<Request>> in_flight(window);
  auto start = std::chrono::steady_clock::now();
  uint64_t sent = 0;
  for (uint64_t k = 0; sent < total; ++k) {
    auto& slot = in_flight[k % window];
    if (slot) {
      auto status = slot->wait(120s);
      if (!status.ok()) throw Error(status);
    }
    size_t length = static_cast<size_t>(std::min<uint64_t>(message_bytes, total - sent));
    slot = connection->post_send(std::span(payload.data(), length));
    sent += length;
  }
  auto status = ack->wait(120s);
  if (!status.ok()) throw Error(status);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (acked != total) {
    throw Error(Errc::verify_failed,
                "bench: server received " + std::to_string(acked) + " of " + std::to_string(total) + " bytes");
  }
  connection->close();
  int wstatus = 0;
  ::waitpid(server, &wstatus, 0);
  reaper.pid = -1;
  double gbps = static_cast<double>(total) / 1e9 / seconds;
  if (o.json) {
    nlohmann::json out = {{"transport", o.scheme},   {"bytes", total},
                          {"seconds", seconds},      {"gbytes_per_s", gbps},
                          {"gbits_per_s", gbps * 8}, {"message_bytes", message_bytes},
                          {"window", o.window},      {"egress_bytes_per_s", options.egress_bytes_per_second}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("%s: %llu bytes in %.3f s = %.3f GB/s (%.2f Gbit/s), %zu-byte messages, window %d\n", o.scheme.c_str(),
                static_cast<unsigned long long>(total), seconds, gbps, gbps * 8, message_bytes, o.window);
  }
}

void setup_bench(CLI::App& parent) {
  auto* bench = parent.add_subcommand("bench", "Measure deltacast components");
  bench->require_subcommand(1);
  auto options = std::make_shared<LinkOptions>();
  auto* link = bench->add_subcommand("link", "Point-to-point transport throughput between two local processes");
  link->add_option("--transport", options->scheme, "Transport scheme: tcp, loop, ofi+tcp, ofi+shm, ucx")
      ->capture_default_str();
  link->add_option("--size", options->size_text, "Bytes to move (e.g. 1GiB)")->capture_default_str();
  link->add_option("--message-size", options->message_text, "Bytes per message")->capture_default_str();
  link->add_option("--window", options->window, "Messages in flight")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  link->add_option("--egress", options->egress_text,
                   "Cap the sender's egress at this rate (100Mbit/s, 1Gbit/s; 0 = none), as egress.* in a run config")
      ->capture_default_str();
  link->add_option("--burst", options->burst_text, "Token-bucket depth of --egress (0 = 10 ms at the rate, >= 64KiB)")
      ->capture_default_str();
  link->add_flag("--json", options->json, "Print one JSON object");
  link->add_option("--role", options->role)->group("")->check(CLI::IsMember({"client", "server"}));
  link->callback([options] {
    uint64_t total = config::parse_size(options->size_text);
    size_t message_bytes = static_cast<size_t>(config::parse_size(options->message_text));
    if (total == 0 || message_bytes == 0)
      throw Error(Errc::invalid_argument, "bench link: --size and --message-size must be > 0");
    if (options->scheme == "loop")
      throw Error(Errc::invalid_argument, "bench link: loop is in-process; pick a network transport");
    if (options->role == "server") {
      run_server(*options, total, message_bytes);
    } else {
      run_client(*options, total, message_bytes);
    }
  });
  setup_bench_tree(*bench);  // `deltacast bench tree` (tools/bench/tree.h)
}

const CommandRegistrar registrar{"bench", &setup_bench};

}  // namespace
}  // namespace deltacast::tools::bench_command
