#include "comm_backends/collective/link_auth.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "comm_backends/collective/wire.h"
#include "comm_backends/control/socket.h"

namespace commsched::collective {
namespace {

constexpr const char* kNoProof = "did not prove the run's shared secret (no or another COMMSCHED_SECRET / COMMSCHED_KEY_FILE)";

// A handshake is a few small frames: a connector that needs longer is not one of ours, or is stuck.
constexpr double kMaxAnswerS = 10.0;

double seconds_left(LinkAuth::Deadline deadline) {
  return std::max(0.001, std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count());
}

}  // namespace

LinkAuth::LinkAuth(std::string secret, std::string_view link, std::string listener)
    : handshake_(secret, link), enabled_(!secret.empty()), listener_(std::move(listener)) {}

std::string LinkAuth::challenge() {
  nonce_ = SecretHandshake::nonce();
  ByteWriter w;
  w.put<uint8_t>(0);
  w.put_string(nonce_);
  return w.take_frame();
}

std::optional<std::string> LinkAuth::reply_to(std::string_view answer) const {
  std::string client_nonce, mac;
  try {
    ByteReader r(answer, "authentication answer");
    client_nonce = r.get_string();
    mac = r.get_string();
  } catch (const std::exception&) {
    return std::nullopt;  // not an answer at all: a peer without the secret, or not ours
  }
  if (!handshake_.client_proved(mac, nonce_, client_nonce)) return std::nullopt;
  ByteWriter w;
  w.put_string(handshake_.server_proof(client_nonce, nonce_));
  return w.take_frame();
}

bool LinkAuth::admit(int fd, Deadline deadline) {
  if (!enabled_) return true;
  std::optional<std::string> reply;
  try {
    set_receive_timeout(fd, std::min(kMaxAnswerS, seconds_left(deadline)));
    send_all(fd, challenge(), "authentication challenge");
    reply = reply_to(recv_frame(fd, "authentication answer", kMaxHandshakeFrame));
    if (reply) send_all(fd, *reply, "authentication reply");
    set_receive_timeout(fd, 0);
  } catch (const std::exception&) {
    reply.reset();  // gone, silent or oversized: refused like a wrong proof
  }
  if (!reply) refuse(fd);
  return reply.has_value();
}

void LinkAuth::refuse(int fd) {
  const std::string found = control::peer_address(fd);
  std::string address = found.empty() ? std::string("?") : found;
  std::fprintf(stderr, "[commsched] %s refused %s: it %s\n", listener_.c_str(), address.c_str(), kNoProof);
  refused_.push_back(std::move(address));
}

std::string LinkAuth::refusals() const {
  if (refused_.empty()) return "";
  std::string out = "; " + listener_ + " refused connections that " + kNoProof + ": ";
  for (size_t i = 0; i < refused_.size(); ++i) out += (i ? ", " : "") + refused_[i];
  return out;
}

void LinkAuth::prove(int fd, Deadline deadline, const std::string& where) const {
  if (!enabled_) return;
  set_receive_timeout(fd, seconds_left(deadline));
  std::string server_nonce;
  try {
    const std::string frame = recv_frame(fd, where, kMaxHandshakeFrame);
    ByteReader r(frame, where);
    r.get<uint8_t>();
    server_nonce = r.get_string();
  } catch (const std::exception& e) {
    throw std::runtime_error(where + " sent no authentication challenge (" + e.what() +
                             "); does every process use the same COMMSCHED_SECRET / COMMSCHED_AUTH?");
  }
  if (server_nonce.size() != SecretHandshake::kNonceBytes)
    throw std::runtime_error(where + ": malformed authentication challenge");
  const std::string mine = SecretHandshake::nonce();
  ByteWriter w;
  w.put_string(mine);
  w.put_string(handshake_.client_proof(server_nonce, mine));
  send_all(fd, w.take_frame(), where);
  std::string mac;
  try {
    const std::string frame = recv_frame(fd, where, kMaxHandshakeFrame);
    ByteReader r(frame, where);
    mac = r.get_string();
  } catch (const std::exception&) {
    throw std::runtime_error(where + " refused us: the shared secret differs (COMMSCHED_SECRET / COMMSCHED_KEY_FILE)");
  }
  if (!handshake_.server_proved(mac, mine, server_nonce))
    throw std::runtime_error(where + " did not prove the shared secret: not a member of this run");
  set_receive_timeout(fd, 0);
}

}  // namespace commsched::collective
