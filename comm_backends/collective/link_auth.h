// The run's SecretHandshake (comm_backends/cluster_auth.h) spoken in the collective's length-prefixed frames (wire.h),
// by every collective link that proves the shared secret: the rendezvous store ("store") and the order negotiation
// ("negotiation"). The link's name keys the proofs, so one made for the store is worthless on the negotiation.
//
//   listener  -> connector   {u8 0, string nonce}     (the 0 reads as "not found" / no message type to a peer that
//                                                      does not authenticate, never as data)
//   connector -> listener    {string nonce, string proof}
//   listener  -> connector   {string proof}           (a connector that did not prove the secret gets no reply: the
//                                                      listener logs it, naming its address, and closes the connection)
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm_backends/cluster_auth.h"

namespace commsched::collective {

// What a peer without the secret is told when it meets a challenge instead of the reply it expected.
inline constexpr const char* kNeedsSecret =
    "requires the run's shared secret: set the same COMMSCHED_SECRET or COMMSCHED_KEY_FILE on every process";

// A handshake's frames hold two 32-byte strings at most. Whoever announces more has not proved anything yet: refused
// before a byte of it is read (the general frame bound, 64 MiB, would have allocated that much for each stranger and
// waited for it). Every reader of a frame before the proof applies it: the blocking handshake here and the
// rendezvous store's non-blocking one.
inline constexpr uint32_t kMaxHandshakeFrame = 1024;

class LinkAuth {
 public:
  using Deadline = std::chrono::steady_clock::time_point;
  // An empty secret: the link does not authenticate (admit and prove let everything through). `listener` names this
  // side in the log of a refusal ("negotiator rank 0").
  LinkAuth(std::string secret, std::string_view link, std::string listener = {});

  // Listener: the challenge frame to send first (a fresh nonce, kept for reply_to).
  std::string challenge();
  // Listener: the connector's answer (a frame without its length prefix). The reply frame to send when it proved the
  // secret; nullopt when it did not (or the answer is malformed).
  std::optional<std::string> reply_to(std::string_view answer) const;
  // Listener, on a blocking socket: challenge, answer and reply, waiting at most 10 s (and not past `deadline`) for
  // the answer. False, logged by refuse(), when the connector did not prove the secret, said nothing or went away.
  bool admit(int fd, Deadline deadline);
  // Listener: logs that the connection was refused (naming its address) and remembers it for refusals().
  void refuse(int fd);
  // "" when nothing was refused; otherwise "; <listener> refused connections that ...: <addresses>", for the error of
  // a join that strangers may have spoiled.
  std::string refusals() const;

  // Connector, on a blocking socket: waits for the challenge until `deadline` (a listener may be busy refusing
  // others first), answers it and checks the listener's proof. Throws std::runtime_error starting with `where` when there is no challenge (the listener does not
  // authenticate), when the listener refuses (another secret) or when it cannot prove the secret itself.
  void prove(int fd, Deadline deadline, const std::string& where) const;

 private:
  SecretHandshake handshake_;
  bool enabled_;
  std::string listener_;
  std::string nonce_;  // the listener's challenge
  std::vector<std::string> refused_;
};

}  // namespace commsched::collective
