// Small helpers shared by the server and the worker: encode a header and send it with a payload.
#pragma once

#include <array>
#include <memory>
#include <string>

#include "comm_backends/ps/protocol.h"
#include "comm_backends/ps/transport.h"

namespace commsched::ps {

inline void send_msg(Transport& t, PeerId peer, const Header& h, OutPayload payload = {}) {
  std::array<std::byte, kHeaderBytes> buf;
  encode_header(h, buf);
  t.send(peer, buf, std::move(payload));
}

// Sends a text payload (error message, endpoint list); the string lives until the transport lets go of it.
inline void send_text(Transport& t, PeerId peer, const Header& h, std::string text) {
  if (text.size() > kMaxTextPayload) text.resize(kMaxTextPayload);
  auto owned = std::make_shared<std::string>(std::move(text));
  OutPayload p{reinterpret_cast<const std::byte*>(owned->data()), owned->size(), [owned] {}};
  send_msg(t, peer, h, std::move(p));
}

inline std::string payload_text(const Payload* p) {
  if (!p) return {};
  auto b = p->bytes();
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

}  // namespace commsched::ps
