// The secret handshake of the collective's links (comm_backends/collective/link_auth: the rendezvous store and the
// order negotiation), from both ends, with whatever a stranger sends. Nobody without the secret can make the proof,
// so every input must be refused: the listener gives no reply to any answer; the connector, reading any bytes from a
// listener, throws std::runtime_error (never crashes, never another exception, never waits past its deadline) and
// never accepts. An honest connector's answer, with the nonce taken from the input, is accepted exactly when the nonce
// has the handshake's size, and the listener's reply then proves the secret to it.
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "comm_backends/collective/link_auth.h"
#include "comm_backends/control/socket.h"
#include "comm_backends/collective/wire.h"
#include "tests/fuzz/fuzz_target.h"

using namespace commsched;
using namespace commsched::collective;

namespace {

const std::string kSecret = "fuzzing-secret-of-this-run-0123456789";

// The nonce of a challenge frame (length prefix included), as a connector reads it.
std::string challenge_nonce(const std::string& frame) {
  ByteReader r(std::string_view(frame).substr(4), "challenge");
  r.get<uint8_t>();
  return r.get_string();
}

void listener_refuses(std::string_view answer) {
  LinkAuth listener(kSecret, "store", "fuzz listener");
  listener.challenge();
  FUZZ_CHECK(!listener.reply_to(answer));
}

void honest_connector(std::string_view client_nonce) {
  LinkAuth listener(kSecret, "store", "fuzz listener");
  const std::string server_nonce = challenge_nonce(listener.challenge());
  const SecretHandshake handshake(kSecret, "store");
  ByteWriter w;
  w.put_string(client_nonce);
  w.put_string(handshake.client_proof(server_nonce, client_nonce));
  const std::string answer = w.take_frame();
  const auto reply = listener.reply_to(std::string_view(answer).substr(4));
  FUZZ_CHECK(reply.has_value() == (client_nonce.size() == SecretHandshake::kNonceBytes));
  if (!reply) return;
  ByteReader r(std::string_view(*reply).substr(4), "reply");
  FUZZ_CHECK(handshake.server_proved(r.get_string(), client_nonce, server_nonce));
}

// The input is everything the listener sends, then the listener goes quiet (end of stream).
void connector_refuses(std::string_view from_listener) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return;
  const Fd mine(fds[0]), theirs(fds[1]);
  try {
    send_all(theirs.get(), from_listener, "fuzz listener");
  } catch (const std::runtime_error&) {
    return;  // more than the socket buffers: not a handshake
  }
  ::shutdown(theirs.get(), SHUT_WR);
  const LinkAuth connector(kSecret, "store");
  bool accepted = true;
  try {
    connector.prove(mine.get(), std::chrono::steady_clock::now() + std::chrono::seconds(5), "fuzz listener");
  } catch (const std::runtime_error&) {
    accepted = false;
  }
  FUZZ_CHECK(!accepted);
}

}  // namespace

// First byte: which side (listener, honest connector, connector); the rest is what the other side sent.
int fuzz_link_auth(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 3) {
    case 0: listener_refuses(rest); break;
    case 1: honest_connector(rest); break;
    default: connector_refuses(rest); break;
  }
  return 0;
}

COMMSCHED_FUZZ_TARGET(fuzz_link_auth)
