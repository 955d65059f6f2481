// RMA-capable backends (libfabric, UCX) beyond the conformance suite: RMA writes with a serialised
// remote key (one key valid on every connection), ordering of a write before a later send, bounds
// checks on remote keys, and a message as large as the limit (several 64 MiB libfabric fragments;
// the UCX rendezvous path). Schemes not built are skipped.
#include <cstring>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "transport/transport.h"

namespace deltacast::transport {
namespace {

using namespace std::chrono_literals;

TransportOptions options() {
  TransportOptions o;
  o.secret = "rma-backend-test";
  o.heartbeat_interval = 100ms;
  o.peer_timeout = 1500ms;
  return o;
}

class RmaBackend : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!backend_built(GetParam())) GTEST_SKIP() << GetParam() << " is not built";
    server_ = make_transport(GetParam(), options());
    client_ = make_transport(GetParam(), options());
    listener_ = server_->listen(Url::parse(GetParam() + "://127.0.0.1:0"));
  }
  std::unique_ptr<Transport> server_, client_;
  std::unique_ptr<Listener> listener_;
};

TEST_P(RmaBackend, WriteThenSendDeliversBitsBeforeTheMessage) {
  if (!server_->capabilities().rma) GTEST_SKIP() << GetParam() << " offers no RMA here";
  // Two connections: the key registered once must be valid on both.
  auto a1 = client_->connect(listener_->local_url(), 5s);
  auto b1 = listener_->accept(10s);
  auto a2 = client_->connect(listener_->local_url(), 5s);
  auto b2 = listener_->accept(10s);
  ASSERT_TRUE(b1 && b2);
  std::vector<uint64_t> target(1 << 20, 0);
  auto target_region = server_->register_memory(std::as_writable_bytes(std::span(target)), MemoryKind::host);
  std::vector<uint64_t> source(1 << 20);
  std::iota(source.begin(), source.end(), uint64_t{77});
  auto source_region = client_->register_memory(std::as_writable_bytes(std::span(source)), MemoryKind::host);
  auto key = target_region->remote_key();
  ASSERT_FALSE(key.empty());
  for (auto* pair : {&a1, &a2}) {
    std::fill(target.begin(), target.end(), 0);
    auto& a = *pair;
    auto& b = pair == &a1 ? b1 : b2;
    uint32_t note = 0;
    auto note_recv = b->post_recv(std::as_writable_bytes(std::span(&note, 1)));
    auto write = a->post_write(std::as_bytes(std::span(source)), source_region.get(), RemoteBuffer{key, 0});
    uint32_t done = 1;
    auto send = a->post_send(std::as_bytes(std::span(&done, 1)));
    ASSERT_TRUE(note_recv->wait(30s).ok());
    // The message was sent after the write: the written bits are in place when it arrives.
    EXPECT_EQ(std::memcmp(target.data(), source.data(), target.size() * 8), 0);
    ASSERT_TRUE(write->wait(30s).ok());
    ASSERT_TRUE(send->wait(30s).ok());
  }
}

TEST_P(RmaBackend, WriteOutsideTheRemoteRegionIsRefused) {
  if (!server_->capabilities().rma) GTEST_SKIP() << GetParam() << " offers no RMA here";
  auto a = client_->connect(listener_->local_url(), 5s);
  auto b = listener_->accept(10s);
  std::vector<std::byte> target(4096), source(4096);
  auto region = server_->register_memory(target, MemoryKind::host);
  try {
    a->post_write(source, nullptr, RemoteBuffer{region->remote_key(), 1});
    FAIL() << "a write overrunning the remote region was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
  }
  try {
    a->post_write(source, nullptr, RemoteBuffer{std::vector<std::byte>(5), 0});
    FAIL() << "a malformed remote key was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
  }
}

TEST_P(RmaBackend, MessageAsLargeAsTheLimitIsBitExact) {
  auto o = options();
  o.max_message_bytes = (size_t{129} << 20) + 3;
  auto server = make_transport(GetParam(), o);
  auto client = make_transport(GetParam(), o);
  auto listener = server->listen(Url::parse(GetParam() + "://127.0.0.1:0"));
  auto a = client->connect(listener->local_url(), 5s);
  auto b = listener->accept(10s);
  ASSERT_TRUE(b);
  const size_t size = o.max_message_bytes;  // two full 64 MiB fragments and a short third one
  std::vector<std::byte> message(size);
  for (size_t i = 0; i < size; ++i) message[i] = static_cast<std::byte>((i * 2654435761u) >> 13);
  std::vector<std::byte> buffer(size + 100);
  auto recv = b->post_recv(buffer);
  auto send = a->post_send(message);
  ASSERT_TRUE(send->wait(60s).ok());
  ASSERT_TRUE(recv->wait(60s).ok());
  ASSERT_EQ(recv->bytes(), size);
  EXPECT_EQ(std::memcmp(buffer.data(), message.data(), size), 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, RmaBackend, ::testing::Values("ofi+tcp", "ofi+shm", "ucx"),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           std::string name = param_info.param;
                           for (auto& c : name)
                             if (c == '+') c = '_';
                           return name;
                         });

}  // namespace
}  // namespace deltacast::transport
