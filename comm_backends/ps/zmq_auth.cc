#include "comm_backends/ps/zmq_auth.h"

#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "comm_backends/cluster_auth.h"
#include "comm_backends/ps/zmq_message.h"

namespace commsched::ps {
namespace {
// Where ZeroMQ sends the handshake of every CURVE connection to a bound socket, to wait for our verdict.
constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";
}  // namespace

CurveKeys::CurveKeys(const std::string& secret) {
  auto sk = ClusterAuth::derive(secret, "commsched zmq curve v1");
  if (!zmq_z85_encode(secret_z85, sk.data(), sk.size()) || zmq_curve_public(public_z85, secret_z85) != 0)
    throw std::runtime_error(zmq_err("cannot derive the CURVE key pair"));
  zmq_z85_decode(public_raw.data(), public_z85);
}

// What a failed handshake most likely means, for the log line of the refused connection.
std::string handshake_reason(uint16_t event, int32_t value, bool curve) {
  if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) return "authentication refused (no or wrong shared secret)";
  char code[32];
  std::snprintf(code, sizeof code, " (ZeroMQ protocol error 0x%x)", static_cast<unsigned>(value));
  if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
    return std::string(curve ? "the peer does not authenticate" : "the server requires authentication") +
           ": no shared secret on one side (COMMSCHED_SECRET / COMMSCHED_KEY_FILE)" + code;
  if (curve) return std::string("CURVE handshake failed: the peer has no or a wrong shared secret") + code;
  // Without keys the other side cannot be told apart: a CURVE server cuts the handshake of a plain client short.
  return std::string("ZMTP handshake failed: the peer may require a shared secret this process lacks "
                     "(COMMSCHED_SECRET / COMMSCHED_KEY_FILE), or it sent foreign or malformed bytes") + code;
}

void* bind_zap_handler(void* ctx, int linger_ms) {
  void* zap = zmq_socket(ctx, ZMQ_REP);
  if (!zap) throw std::runtime_error(zmq_err("zmq_socket"));
  zmq_setsockopt(zap, ZMQ_LINGER, &linger_ms, sizeof linger_ms);
  if (zmq_bind(zap, kZapEndpoint) != 0) {
    const std::string why = zmq_err("cannot bind the ZAP handler");
    zmq_close(zap);
    throw std::runtime_error(why);
  }
  return zap;
}

std::vector<std::string> serve_zap(void* zap, const CurveKeys& keys) {
  std::vector<std::string> refused;
  for (;;) {
    std::vector<std::string> req;
    bool more = true;
    while (more) {
      zmq_msg_t part;
      zmq_msg_init(&part);
      if (zmq_msg_recv(&part, zap, req.empty() ? ZMQ_DONTWAIT : 0) < 0) {
        zmq_msg_close(&part);
        return refused;
      }
      req.emplace_back(static_cast<char*>(zmq_msg_data(&part)), zmq_msg_size(&part));
      more = zmq_msg_more(&part);
      zmq_msg_close(&part);
    }
    // version, request id, domain, address, identity, mechanism, credentials...
    const bool ok = req.size() >= 7 && req[5] == "CURVE" && req[6].size() == keys.public_raw.size() &&
                    std::memcmp(req[6].data(), keys.public_raw.data(), req[6].size()) == 0;
    const std::string id = req.size() > 1 ? req[1] : "";
    const std::string code = ok ? "200" : "400";
    const std::string text = ok ? "OK" : "client key is not this run's";
    zmq_send(zap, "1.0", 3, ZMQ_SNDMORE);
    zmq_send(zap, id.data(), id.size(), ZMQ_SNDMORE);
    zmq_send(zap, code.data(), code.size(), ZMQ_SNDMORE);
    zmq_send(zap, text.data(), text.size(), ZMQ_SNDMORE);
    zmq_send(zap, "", 0, ZMQ_SNDMORE);
    zmq_send(zap, "", 0, 0);
    if (!ok)
      refused.push_back("connection from " + (req.size() > 3 ? req[3] : std::string("?")) +
                        " refused: its CURVE key is not this run's (no or wrong shared secret)");
  }
}

}  // namespace commsched::ps
