// The ZeroMQ transport's authentication (zmq_transport.cc says how it is used): every process derives the same CURVE
// key pair from the shared secret, and a ZAP handler (ZeroMQ's authentication hook, RFC 27) on the bound side accepts
// exactly that pair's client key. Also: what a failed handshake most likely means, for the refused connection's log.
#pragma once

#include <zmq.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace commsched::ps {

// The monitor events of a handshake that failed.
inline constexpr int kHandshakeFailed =
    ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;

// The run's CURVE key pair, Z85 text as ZeroMQ's socket options want it.
struct CurveKeys {
  char public_z85[41] = {};
  char secret_z85[41] = {};
  std::array<uint8_t, 32> public_raw{};

  // Throws std::runtime_error when libzmq cannot derive the pair.
  explicit CurveKeys(const std::string& secret);
};

// What a failed handshake (monitor `event` with its `value`) most likely means; `curve`: this side authenticates.
std::string handshake_reason(uint16_t event, int32_t value, bool curve);

// Binds the ZAP handler's socket in `ctx` (before any CURVE server socket is bound); the caller polls and closes it.
void* bind_zap_handler(void* ctx, int linger_ms);
// Answers the ZAP requests pending on `zap`: accepts exactly `keys`' client key. Returns why each refused connection
// was refused (a refused connection never delivers a message: this is all that is heard of it).
std::vector<std::string> serve_zap(void* zap, const CurveKeys& keys);

}  // namespace commsched::ps
