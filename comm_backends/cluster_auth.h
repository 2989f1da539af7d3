// Who may join a cluster: one shared secret per run, from which every transport derives its own keys (ZeroMQ CURVE
// keys for the parameter server, an HMAC key for the collective rendezvous store).
//
//   COMMSCHED_AUTH       auto | on | off   auto (default): authenticate when a secret is configured, and REQUIRE one
//                                          when this process binds beyond loopback; on: always require a secret;
//                                          off: never authenticate (a warning when binding beyond loopback)
//   COMMSCHED_SECRET     the shared secret itself (at least 16 characters); `commsched launch` sets a fresh one
//   COMMSCHED_KEY_FILE   a file holding the shared secret (first line); must not be readable by group or others
//
// COMMSCHED_SECRET wins over COMMSCHED_KEY_FILE. Every process of a run must see the same secret. The three are rows
// of the option registry (auth_option_table(), group "auth"), so `commsched options` and the README table list them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "options/option_table.h"

namespace commsched {

inline constexpr size_t kMinSecretChars = 16;

// What the environment says about authentication, as the registry's rows read it (ClusterAuth::from_env resolves it).
struct AuthOptions {
  std::string mode = "auto";
  std::string secret;
  std::string key_file;
};
const OptionTable<AuthOptions>& auth_option_table();

struct ClusterAuth {
  enum class Mode { automatic, on, off };
  Mode mode = Mode::automatic;
  std::string secret;  // empty: none configured

  // Reads COMMSCHED_AUTH, COMMSCHED_SECRET, COMMSCHED_KEY_FILE. Throws InvalidArgument naming the variable (bad mode,
  // short secret, unreadable or group/world-readable key file).
  static ClusterAuth from_env();
  // The secret this process must authenticate with when its sockets bind `bind_host` ("" : authentication off).
  // Throws InvalidArgument when the mode requires a secret and none is configured, naming the switch.
  std::string secret_for(const std::string& bind_host) const;
  // 32 bytes derived from the secret for one use ("zmq-curve", "store-hmac"): keyed BLAKE2b, so one key reveals
  // nothing about the secret or the other keys.
  static std::array<uint8_t, 32> derive(std::string_view secret, std::string_view purpose);
  // A fresh random secret (32 random bytes, hex) for one run.
  static std::string generate_secret();
  // A handshake proof: HMAC-SHA256 with the key derive(secret, purpose) over tag || first || second. Each side signs
  // both sides' fresh nonces (or whole hellos) with its own tag first, so a proof can be neither replayed (fresh
  // nonces) nor reflected back to its sender (the tags differ).
  static std::string proof(std::string_view secret, std::string_view purpose, std::string_view tag,
                           std::span<const std::byte> first, std::span<const std::byte> second);
  // Constant-time comparison of two proofs (false when the sizes differ).
  static bool same_proof(std::string_view a, std::string_view b);
  // Fills `out` from the system's cryptographic random source (nonces, connection tokens).
  static void random_bytes(std::span<std::byte> out);
};

// The one mutual challenge-response of every link that proves the run's secret over its own stream (the rendezvous
// store, the launchers' node link): the listener sends a fresh nonce, the connecting side answers with its own nonce
// and a proof over both, the listener answers with its proof over both in the other order. The link's name keys the
// HMAC and tags each side, so a proof made for one link or one side is worthless on another.
class SecretHandshake {
 public:
  static constexpr size_t kNonceBytes = 32;
  // link: "store", "node link", ... (part of the key and of both tags; changing it changes the wire).
  SecretHandshake(std::string secret, std::string_view link);
  static std::string nonce();  // kNonceBytes fresh random bytes
  std::string client_proof(std::string_view server_nonce, std::string_view client_nonce) const;
  std::string server_proof(std::string_view client_nonce, std::string_view server_nonce) const;
  // Constant time; false for a nonce of the wrong size too.
  bool client_proved(std::string_view mac, std::string_view server_nonce, std::string_view client_nonce) const;
  bool server_proved(std::string_view mac, std::string_view client_nonce, std::string_view server_nonce) const;

 private:
  std::string sign(const std::string& tag, std::string_view first, std::string_view second) const;
  std::string secret_, purpose_, client_tag_, server_tag_;
};

// Whether a bind host stays on this machine: 127.x.x.x, ::1, "localhost" or the loopback interface "lo".
bool is_loopback_host(const std::string& host);

}  // namespace commsched
