// The UCX transport's connections (ucx_transport_impl.h): each peer's TCP socket is dialled (and redialled until it
// first stands) or accepted, carries the versioned hello with its authentication, and afterwards tells liveness.
#include "comm_backends/ps/ucx_transport_impl.h"

#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>

#include "comm_backends/cluster_auth.h"
#include "comm_backends/control/socket.h"

namespace commsched::ps::ucx {
namespace {

// The UCX transports (tl/device) on an endpoint's lanes, from UCX's own description of the endpoint.
std::string lanes_of(ucp_ep_h ep) {
  char* text = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&text, &len);
  if (!f) return "?";
  ucp_ep_print_info(ep, f);
  std::fclose(f);
  std::string out;
  std::set<std::string> seen;
  const std::string all(text, len);
  std::free(text);
  for (size_t at = all.find("lane["); at != std::string::npos; at = all.find("lane[", at + 1)) {
    // "lane[0]:  2:posix/memory.0 md[2] ... am am_bw#0": the token after "N:" up to the ".index".
    const size_t colon = all.find(':', all.find(']', at));
    size_t b = all.find_first_not_of(' ', colon + 1);
    b = all.find(':', b) + 1;
    const size_t e = all.find_first_of(" \n", b);
    std::string tl = all.substr(b, e - b);
    if (auto dot = tl.rfind('.'); dot != std::string::npos && dot > tl.find('/')) tl.resize(dot);
    if (!tl.empty() && seen.insert(tl).second) out += (out.empty() ? "" : ", ") + tl;
  }
  return out.empty() ? "?" : out;
}

}  // namespace

void UcxTransport::start_dial(PeerId id, Peer& p) {
  p.state = Peer::State::dialing;
  p.rx.clear();
  bool connected = false;
  control::Fd fd = control::start_connect(*p.dial, connected);
  if (!fd.valid()) return schedule_redial(p);
  p.fd = fd.release();
  if (connected) return dialed(id, p);
}

void UcxTransport::dialed(PeerId id, Peer& p) {
  int err = 0;
  socklen_t len = sizeof err;
  getsockopt(p.fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) return schedule_redial(p);
  p.state = Peer::State::hello;
  send_hello(id, p);
}

void UcxTransport::schedule_redial(Peer& p) {
  close_fd(p);
  p.state = Peer::State::dialing;
  p.redial_at = Clock::now() + kRedialDelay;
  redial_pending_ = true;
}

void UcxTransport::redial_due() {
  if (!redial_pending_) return;
  redial_pending_ = false;
  const auto now = Clock::now();
  for (auto& [id, p] : peers_) {
    if (p.state != Peer::State::dialing || p.fd >= 0) continue;
    if (now >= p.redial_at) start_dial(id, p);
    else redial_pending_ = true;
  }
}

// Blocking write of a few hundred bytes on a fresh socket: fits in its buffer at once.
void UcxTransport::write_all(PeerId id, Peer& p, std::span<const std::byte> bytes) {
  size_t off = 0;
  while (off < bytes.size() && p.fd >= 0) {
    const ssize_t n = ::send(p.fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n > 0) off += static_cast<size_t>(n);
    else if (n < 0 && (errno == EAGAIN || errno == EINTR)) ::poll(nullptr, 0, 1);
    else return socket_ended(id, p, "connection closed during the hello");
  }
}

// Our hello to this peer: a fresh token (what it must put before its messages to us) and a fresh nonce.
void UcxTransport::send_hello(PeerId id, Peer& p) {
  std::vector<std::byte>& h = p.my_hello;
  h.assign(kHelloFixed, std::byte{0});
  std::memcpy(h.data(), kHelloMagic, 8);
  ClusterAuth::random_bytes({reinterpret_cast<std::byte*>(&p.token), sizeof p.token});
  const uint64_t mine = id;
  const uint32_t flags = authenticates() ? kFlagAuthenticates : 0;
  const uint32_t len = static_cast<uint32_t>(address_.size());
  std::memcpy(h.data() + 8, &mine, 8);
  std::memcpy(h.data() + 16, &p.token, 8);
  ClusterAuth::random_bytes(std::span(h).subspan(24, 16));
  std::memcpy(h.data() + 40, &flags, 4);
  std::memcpy(h.data() + 44, &len, 4);
  h.insert(h.end(), address_.begin(), address_.end());
  std::vector<std::byte> out = h;
  if (!p.dial) append(out, proof_for(p, "accept"));  // the acceptor answers with its hello and its proof at once
  write_all(id, p, out);
}

// Our proof for this connection: over their hello, then ours. Empty-secret runs send zeros (never checked).
std::string UcxTransport::proof_for(const Peer& p, std::string_view tag) const {
  if (!authenticates()) return std::string(kProofBytes, '\0');
  return ClusterAuth::proof(opts_.auth_secret, kProofPurpose, tag, p.their_hello, p.my_hello);
}

// Whether the peer's proof (over our hello, then theirs) shows it holds our secret.
bool UcxTransport::proof_holds(const Peer& p, std::string_view tag, std::span<const std::byte> proof) const {
  if (!authenticates()) return true;
  const std::string want = ClusterAuth::proof(opts_.auth_secret, kProofPurpose, tag, p.my_hello, p.their_hello);
  return ClusterAuth::same_proof(want, {reinterpret_cast<const char*>(proof.data()), proof.size()});
}

void UcxTransport::append(std::vector<std::byte>& out, const std::string& bytes) {
  const auto* b = reinterpret_cast<const std::byte*>(bytes.data());
  out.insert(out.end(), b, b + bytes.size());
}

void UcxTransport::accept_all() {
  for (;;) {
    control::Fd fd;
    try {
      fd = control::accept_tcp(listen_fd_);
    } catch (const std::runtime_error&) {
      return;  // out of descriptors or the like: the listener stays readable and the next round tries again
    }
    if (!fd.valid()) return;
    control::set_nonblocking(fd.get(), true);
    control::tune_control_socket(fd.get(), 0);  // TCP_NODELAY (a non-blocking send never waits anyway)
    const PeerId id = next_peer_++;
    Peer& p = peers_[id];
    p.addr = control::peer_address(fd.get());
    p.fd = fd.release();
    p.state = Peer::State::hello;
  }
}

// Socket readable: the handshake while connecting, afterwards only the end of the connection.
void UcxTransport::readable(PeerId id, Peer& p) {
  std::byte buf[4096];
  for (;;) {
    const ssize_t n = ::recv(p.fd, buf, sizeof buf, 0);
    if (n == 0) return socket_ended(id, p, "connection closed");
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) return;
      return socket_ended(id, p, std::strerror(errno));
    }
    if (p.state != Peer::State::hello && p.state != Peer::State::proving)
      return refuse(id, p, "bytes after the hello (not a commsched UCX peer)");
    p.rx.insert(p.rx.end(), buf, buf + n);
    if (!handshake(id, p)) return;
  }
}

// True while the handshake waits for more bytes; false once it is done or refused.
bool UcxTransport::handshake(PeerId id, Peer& p) {
  if (p.state == Peer::State::proving) return take_dialer_proof(id, p);
  const size_t have = std::min(p.rx.size(), sizeof kHelloMagic);
  if (std::memcmp(p.rx.data(), kHelloMagic, have) != 0) {
    const bool old = have == sizeof kHelloMagic && std::memcmp(p.rx.data(), kHelloMagic, 6) == 0;
    return refuse(id, p, old ? "speaks another version of the commsched UCX hello (mixed commsched builds?)"
                             : "not a commsched UCX hello (foreign or malformed bytes)"), false;
  }
  if (p.rx.size() < kHelloFixed) return true;
  uint32_t flags = 0, len = 0;
  std::memcpy(&p.their_id, p.rx.data() + 8, 8);
  std::memcpy(&p.their_token, p.rx.data() + 16, 8);
  std::memcpy(&flags, p.rx.data() + 40, 4);
  std::memcpy(&len, p.rx.data() + 44, 4);
  if (len == 0 || len > kMaxWorkerAddress)
    return refuse(id, p, "hello with a worker address of " + std::to_string(len) + " bytes"), false;
  const size_t need = kHelloFixed + len + (p.dial ? kProofBytes : 0);  // the acceptor's proof follows its hello
  if (p.rx.size() < need) return true;
  if (p.rx.size() > need) return refuse(id, p, "bytes after the hello"), false;
  p.their_hello.assign(p.rx.begin(), p.rx.begin() + static_cast<long>(kHelloFixed + len));
  // The acceptor answers before judging, so that a dialer it refuses learns why from the flags of this hello.
  if (!p.dial) send_hello(id, p);
  if (p.state == Peer::State::failed) return false;
  if (const bool theirs = flags & kFlagAuthenticates; theirs != authenticates())
    return refuse(id, p, theirs ? "it authenticates with a shared secret and this process has none (set the same "
                                  "COMMSCHED_SECRET or COMMSCHED_KEY_FILE on every process)"
                                : "it did not authenticate: a peer without the shared secret (COMMSCHED_SECRET / "
                                  "COMMSCHED_KEY_FILE) is refused"), false;
  if (!p.dial) {  // accepted: it is a peer once its proof checks
    p.rx.clear();
    p.state = Peer::State::proving;
    return false;
  }
  if (!proof_holds(p, "accept", std::span(p.rx).subspan(kHelloFixed + len)))
    return refuse(id, p, "failed authentication: it holds a different shared secret (COMMSCHED_SECRET)"), false;
  std::vector<std::byte> proof;
  append(proof, proof_for(p, "dial"));
  write_all(id, p, proof);
  if (p.state == Peer::State::failed) return false;
  stand_up(id, p);
  return false;
}

bool UcxTransport::take_dialer_proof(PeerId id, Peer& p) {
  if (p.rx.size() < kProofBytes) return true;
  if (p.rx.size() > kProofBytes) return refuse(id, p, "bytes after the hello"), false;
  if (!proof_holds(p, "dial", p.rx))
    return refuse(id, p, "failed authentication: it holds a different shared secret (COMMSCHED_SECRET)"), false;
  stand_up(id, p);
  return false;
}

// The handshake is done: reach the peer's UCP worker, deliver what it sent meanwhile, post what waited for it.
void UcxTransport::stand_up(PeerId id, Peer& p) {
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.address = reinterpret_cast<const ucp_address_t*>(p.their_hello.data() + kHelloFixed);
  ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;  // the socket detects failures (see the top of the file)
  if (auto s = ucp_ep_create(worker_, &ep, &p.ep); s != UCS_OK) {
    p.ep = nullptr;
    return refuse(id, p, ucs_err("cannot reach its UCX worker address", s));
  }
  for (auto* v : {&p.rx, &p.my_hello, &p.their_hello}) v->clear(), v->shrink_to_fit();
  p.state = Peer::State::up;
  p.was_up = true;
  log_lanes(p);
  deliver(id);
  post_waiting(id, p);
}

void UcxTransport::refuse(PeerId id, Peer& p, const std::string& why) {
  if (p.state == Peer::State::up || p.dial) return lose(id, p, why);
  Incoming e;  // a stranger on our port: dropped, the others are served
  e.kind = Incoming::Kind::dropped;
  e.detail = "connection from " + p.addr + " dropped: " + why;
  events_.push_back(std::move(e));
  close_fd(p);
  p.inbox.clear();  // whatever it sent before failing its proof is never delivered
  p.state = Peer::State::failed;
  p.reported = true;
}

void UcxTransport::socket_ended(PeerId id, Peer& p, const std::string& why) {
  if (p.dial && p.state != Peer::State::up) return schedule_redial(p);  // not there yet: dial again
  if (p.state == Peer::State::proving)  // it had our hello and proof, and left instead of proving itself
    return refuse(id, p, why + " during the handshake, before proving it holds the shared secret");
  if (p.state != Peer::State::up) {  // an accepted connection that never said hello (a port probe)
    close_fd(p);
    p.inbox.clear();
    p.state = Peer::State::failed;
    p.reported = true;
    return;
  }
  drain_ucx();  // its last words (bye, peer_lost) travelled over UCX: take them before the disconnection
  lose(id, p, why);
}

// The peer is gone (or dropped by us): its delivered messages stay, a disconnection follows them.
void UcxTransport::lose(PeerId id, Peer& p, const std::string& why) {
  if (p.state == Peer::State::failed) return;
  const bool was_up = p.state == Peer::State::up;
  p.state = Peer::State::failed;
  p.failure = why;
  close_fd(p);
  if (p.ep) retiring_.push_back(p.ep);
  p.ep = nullptr;
  for (auto& m : p.waiting) m->release();
  p.waiting.clear();
  if (!was_up && !p.dial) p.reported = true;  // never a peer of the protocol
  deliver(id);
}

void UcxTransport::close_fd(Peer& p) {
  if (p.fd >= 0) ::close(p.fd);
  p.fd = -1;
}

void* UcxTransport::close_ep(ucp_ep_h ep) {
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  rp.flags = UCP_EP_CLOSE_FLAG_FORCE;  // no UCX-level goodbye: the peer learns from the socket
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &rp);
  return UCS_PTR_IS_PTR(r) ? r : nullptr;
}

void UcxTransport::close_retired() {
  for (ucp_ep_h ep : retiring_)
    if (void* r = close_ep(ep)) ucp_request_free(r);  // UCX frees it when the close completes
  retiring_.clear();
}

void UcxTransport::flush_all(Clock::time_point deadline) {
  ucp_request_param_t rp{};
  void* r = ucp_worker_flush_nbx(worker_, &rp);
  if (!UCS_PTR_IS_PTR(r)) return;
  while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < deadline) progress_or_nap();
  ucp_request_free(r);
}

void UcxTransport::log_lanes(Peer& p) {
  if (p.lanes_logged || !p.ep) return;
  p.lanes_logged = true;
  const std::string lanes = lanes_of(p.ep);
  if (lanes == last_lanes_) return;  // say it once per distinct choice, not per peer
  last_lanes_ = lanes;
  const char* tls = std::getenv("UCX_TLS");
  std::fprintf(stderr, "[commsched ps ucx] connection to %s over UCX transports: %s (UCX_TLS=%s), %s\n",
               p.addr.c_str(), lanes.c_str(), tls ? tls : "unset: UCX's choice",
               authenticates() ? "peer authenticated by the shared secret" : "unauthenticated (no shared secret)");
  std::fflush(stderr);
}
}  // namespace commsched::ps::ucx
