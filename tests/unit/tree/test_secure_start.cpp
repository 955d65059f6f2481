// Secure by default (docs/security.md): tree::Producer and tree::Receiver refuse, before opening any
// socket, to run unauthenticated on addresses other machines can reach; a secret or
// allow_insecure lets them. Nothing here sends a packet: only 127.0.0.1 is ever bound.
#include <gtest/gtest.h>

#include "codec/manifest.h"
#include "transport/transport.h"
#include "tree/producer.h"
#include "tree/receiver.h"
#include "tree/secure_start.h"
#include "util/error.h"

namespace deltacast::tree {
namespace {

std::unique_ptr<transport::Transport> tcp(const std::string& secret = {}) {
  transport::TransportOptions o;
  o.secret = secret;
  return transport::make_transport("tcp", o);
}

std::string refusal(const std::function<void()>& start) {
  try {
    start();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::config) << e.what();
    return e.what();
  }
  return "";
}

TEST(SecureStart, AnExposedAddressWithoutASecretIsRefusedWithTheWayOut) {
  auto t = tcp();
  const codec::Manifest m({{"w", codec::DType::bf16, {4}}});
  ProducerOptions po;
  po.receivers = 1;
  po.listen_url = "tcp://0.0.0.0:0";  // a wildcard counts as exposed
  const std::string why = refusal([&] { Producer p(*t, m, po); });
  EXPECT_NE(why.find("tcp://0.0.0.0:0"), std::string::npos) << why;
  EXPECT_NE(why.find("secret_file"), std::string::npos) << why;
  EXPECT_NE(why.find("allow_insecure: true"), std::string::npos) << why;
  EXPECT_NE(why.find("chmod 600"), std::string::npos) << why;

  ReceiverOptions ro;
  ro.rank = 3;
  ro.listen_url = "tcp://127.0.0.1:0";
  ro.producer_url = "tcp://10.255.255.1:29500";  // never contacted: refused before any socket
  const std::string r = refusal([&] { Receiver rcv(*t, ro); });
  EXPECT_NE(r.find("rank 3"), std::string::npos) << r;
  EXPECT_NE(r.find("10.255.255.1"), std::string::npos) << r;
}

TEST(SecureStart, LoopbackASecretOrAllowInsecureLetMembersStart) {
  const codec::Manifest m({{"w", codec::DType::bf16, {4}}});
  ProducerOptions po;
  po.receivers = 1;
  po.listen_url = "tcp://127.0.0.1:0";
  auto plain = tcp();
  EXPECT_NO_THROW(Producer(*plain, m, po));  // loopback: nobody else can reach it
  ReceiverOptions ro;
  ro.listen_url = "tcp://127.0.0.1:0";
  ro.producer_url = "tcp://10.255.255.1:29500";
  auto keyed = tcp("0123456789abcdef0123456789abcdef");
  EXPECT_NO_THROW(Receiver(*keyed, ro));  // authenticated
  ro.allow_insecure = true;
  EXPECT_NO_THROW(Receiver(*plain, ro));  // the explicit opt-out
  // The check itself, for every exposed form.
  for (const char* url : {"tcp://[::]:1", "ucx://192.168.0.2:1", "ofi+tcp://node7:1"})
    EXPECT_THROW(require_authenticated(*plain, {url}, false, "x"), Error) << url;
  EXPECT_NO_THROW(require_authenticated(*plain, {"tcp://127.0.0.9:1", "loop://a", ""}, false, "x"));
}

}  // namespace
}  // namespace deltacast::tree
