#include "comm_backends/cluster_auth.h"

#include <sodium.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <stdexcept>

#include "scheduler/config.h"
#include "base/types.h"

namespace commsched {
namespace {

void need_sodium() {
  if (sodium_init() < 0) throw std::runtime_error("libsodium failed to initialise");
}

std::string read_key_file(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0)
    throw InvalidArgument("COMMSCHED_KEY_FILE='" + path + "' cannot be read (no such file?)");
  // Like ssh with private keys: a secret others can read is no secret.
  if ((st.st_mode & 077) != 0)
    throw InvalidArgument("COMMSCHED_KEY_FILE='" + path + "' is readable by group or others; chmod 600 it");
  std::ifstream f(path);
  std::string line;
  if (!f || !std::getline(f, line)) throw InvalidArgument("COMMSCHED_KEY_FILE='" + path + "' is empty or unreadable");
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}

}  // namespace

bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host == "lo" || host == "::1" || host.rfind("127.", 0) == 0;
}

const OptionTable<AuthOptions>& auth_option_table() {
  static const OptionTable<AuthOptions> table = [] {
    OptionTable<AuthOptions> t("auth", "authentication");
    t.bind("auth", "COMMSCHED_AUTH", [](AuthOptions& o) -> std::string& { return o.mode; },
           choice_value({"auto", "on", "off", "1", "0"}),
           "peer authentication (CURVE encryption on the ZeroMQ PS; an HMAC handshake on UCX, the rendezvous store and "
           "the launchers' node link): auto requires a secret when binding beyond loopback and uses one when set; on "
           "always requires one (1 means on); off never authenticates, for trusted networks (0 means off)");
    t.bind("secret", "COMMSCHED_SECRET", [](AuthOptions& o) -> std::string& { return o.secret; },
           text_value("at least 16 characters, the same on every process of the run"),
           "the run's shared secret, from which every link derives its keys (wins over COMMSCHED_KEY_FILE); "
           "`commsched launch` sets a fresh one per one-host run; never printed");
    t.bind("key_file", "COMMSCHED_KEY_FILE", [](AuthOptions& o) -> std::string& { return o.key_file; },
           text_value("a file path, mode 600 (not readable by group or others)"),
           "a file whose first line is the shared secret");
    return t;
  }();
  return table;
}

ClusterAuth ClusterAuth::from_env() {
  AuthOptions o;
  auth_option_table().set_from_env(o);
  ClusterAuth a;
  a.mode = o.mode == "off" || o.mode == "0" ? Mode::off : o.mode == "on" || o.mode == "1" ? Mode::on : Mode::automatic;
  std::string var = "COMMSCHED_SECRET";
  if (!o.secret.empty()) a.secret = o.secret;
  else if (!o.key_file.empty()) a.secret = read_key_file(o.key_file), var = "COMMSCHED_KEY_FILE";
  if (!a.secret.empty() && a.secret.size() < kMinSecretChars)
    throw InvalidArgument(var + ": the shared secret has " + std::to_string(a.secret.size()) +
                          " characters; at least " + std::to_string(kMinSecretChars) + " are required");
  return a;
}

std::string ClusterAuth::secret_for(const std::string& bind_host) const {
  if (mode == Mode::off) {
    // Once per process: server 0 asks here for its store and again for its transport, one warning says it all.
    static std::atomic<bool> warned{false};
    if (!is_loopback_host(bind_host) && !warned.exchange(true))
      std::fprintf(stderr, "[commsched] warning: COMMSCHED_AUTH=off while binding %s: any host that reaches this "
                           "port can join the cluster\n", bind_host.c_str());
    return {};
  }
  if (!secret.empty()) return secret;
  if (mode == Mode::on)
    throw InvalidArgument("COMMSCHED_AUTH=on but no shared secret: set COMMSCHED_SECRET or COMMSCHED_KEY_FILE");
  if (!is_loopback_host(bind_host))
    throw InvalidArgument("binding '" + bind_host + "' beyond loopback requires a shared secret so that strangers "
                          "cannot join: set COMMSCHED_SECRET or COMMSCHED_KEY_FILE on every process (or "
                          "COMMSCHED_AUTH=off to run unauthenticated on a trusted network)");
  return {};
}

std::array<uint8_t, 32> ClusterAuth::derive(std::string_view secret, std::string_view purpose) {
  need_sodium();
  std::array<uint8_t, 32> master{}, out{};
  crypto_generichash(master.data(), master.size(), reinterpret_cast<const unsigned char*>(secret.data()),
                     secret.size(), nullptr, 0);
  crypto_generichash(out.data(), out.size(), reinterpret_cast<const unsigned char*>(purpose.data()), purpose.size(),
                     master.data(), master.size());
  sodium_memzero(master.data(), master.size());
  return out;
}

std::string ClusterAuth::generate_secret() {
  need_sodium();
  std::array<uint8_t, 32> raw{};
  randombytes_buf(raw.data(), raw.size());
  char hex[2 * 32 + 1];
  sodium_bin2hex(hex, sizeof hex, raw.data(), raw.size());
  sodium_memzero(raw.data(), raw.size());
  return hex;
}

std::string ClusterAuth::proof(std::string_view secret, std::string_view purpose, std::string_view tag,
                               std::span<const std::byte> first, std::span<const std::byte> second) {
  auto key = derive(secret, purpose);
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, key.data(), key.size());
  sodium_memzero(key.data(), key.size());
  crypto_auth_hmacsha256_update(&st, reinterpret_cast<const unsigned char*>(tag.data()), tag.size());
  crypto_auth_hmacsha256_update(&st, reinterpret_cast<const unsigned char*>(first.data()), first.size());
  crypto_auth_hmacsha256_update(&st, reinterpret_cast<const unsigned char*>(second.data()), second.size());
  std::string mac(crypto_auth_hmacsha256_BYTES, '\0');
  crypto_auth_hmacsha256_final(&st, reinterpret_cast<unsigned char*>(mac.data()));
  return mac;
}

bool ClusterAuth::same_proof(std::string_view a, std::string_view b) {
  return a.size() == b.size() && sodium_memcmp(a.data(), b.data(), a.size()) == 0;
}

void ClusterAuth::random_bytes(std::span<std::byte> out) {
  need_sodium();
  randombytes_buf(out.data(), out.size());
}

SecretHandshake::SecretHandshake(std::string secret, std::string_view link)
    : secret_(std::move(secret)),
      purpose_("commsched " + std::string(link) + " hmac v1"),
      client_tag_("commsched " + std::string(link) + " client v1"),
      server_tag_("commsched " + std::string(link) + " server v1") {}

std::string SecretHandshake::nonce() {
  std::string n(kNonceBytes, '\0');
  ClusterAuth::random_bytes(std::as_writable_bytes(std::span(n)));
  return n;
}

std::string SecretHandshake::sign(const std::string& tag, std::string_view first, std::string_view second) const {
  return ClusterAuth::proof(secret_, purpose_, tag, std::as_bytes(std::span(first)), std::as_bytes(std::span(second)));
}

std::string SecretHandshake::client_proof(std::string_view server_nonce, std::string_view client_nonce) const {
  return sign(client_tag_, server_nonce, client_nonce);
}

std::string SecretHandshake::server_proof(std::string_view client_nonce, std::string_view server_nonce) const {
  return sign(server_tag_, client_nonce, server_nonce);
}

bool SecretHandshake::client_proved(std::string_view mac, std::string_view server_nonce,
                                    std::string_view client_nonce) const {
  return client_nonce.size() == kNonceBytes && server_nonce.size() == kNonceBytes &&
         ClusterAuth::same_proof(mac, client_proof(server_nonce, client_nonce));
}

bool SecretHandshake::server_proved(std::string_view mac, std::string_view client_nonce,
                                    std::string_view server_nonce) const {
  return client_nonce.size() == kNonceBytes && server_nonce.size() == kNonceBytes &&
         ClusterAuth::same_proof(mac, server_proof(client_nonce, server_nonce));
}

}  // namespace commsched
