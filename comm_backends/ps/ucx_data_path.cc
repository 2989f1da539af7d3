// The UCX transport's data path (ucx_transport_impl.h): each message one UCP active message, sent zero-copy from
// the caller's payload, received eagerly (copied) or by rendezvous (fetched into a pooled buffer or the owner's
// destination), and delivered in arrival order per peer.
#include "comm_backends/ps/ucx_transport_impl.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "comm_backends/ps/buffer_pool.h"

namespace commsched::ps::ucx {

std::unique_ptr<OutMsg> UcxTransport::out_msg(PeerId peer, std::span<const std::byte> header, OutPayload payload) {
  auto m = std::make_unique<OutMsg>();
  m->peer = peer;
  m->header.resize(kPrefix + header.size());  // room for the peer's id and token for us, filled in when posted
  std::copy(header.begin(), header.end(), m->header.begin() + kPrefix);
  m->payload = std::move(payload);
  m->owner = this;
  return m;
}

void UcxTransport::flush_backlog() {
  if (backlog_.empty()) return;
  const auto now = Clock::now();
  while (!backlog_.empty() && bucket_.wait_s(now) <= 0) {
    bucket_.charge(backlog_.front()->header.size() - kPrefix + backlog_.front()->payload.size, now);
    dispatch(pop_front(backlog_));
  }
}

void UcxTransport::dispatch(std::unique_ptr<OutMsg> m) {
  auto it = peers_.find(m->peer);
  if (it == peers_.end()) return m->release();
  Peer& p = it->second;
  if (p.state == Peer::State::failed) {
    m->release();
    return deliver(m->peer);
  }
  p.waiting.push_back(std::move(m));
  post_waiting(it->first, p);
}

// Posts the peer's waiting messages, in order, while it is up and UCX holds fewer than kMaxPostedPerPeer of its
// sends: a peer that falls behind holds the rest here, where they cost nothing until its completions free room.
void UcxTransport::post_waiting(PeerId id, Peer& p) {
  while (!p.waiting.empty() && p.state == Peer::State::up && p.posted < kMaxPostedPerPeer)
    post(id, p, pop_front(p.waiting));
}

// Peers whose completions freed room while UCX progressed (posting from inside its callback is not ours to do).
void UcxTransport::post_freed() {
  while (!freed_.empty()) {
    const PeerId id = freed_.back();
    freed_.pop_back();
    if (auto it = peers_.find(id); it != peers_.end()) post_waiting(id, it->second);
  }
}

void UcxTransport::post(PeerId id, Peer& p, std::unique_ptr<OutMsg> m) {
  std::memcpy(m->header.data(), &p.their_id, 8);
  std::memcpy(m->header.data() + 8, &p.their_token, 8);
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  rp.cb.send = &UcxTransport::on_sent;
  rp.user_data = m.get();
  const void* data = m->payload.data;
  size_t count = m->payload.size;
  if (!m->payload.pieces.empty()) {  // sent in place from each piece (a batch from its tensors)
    for (const auto& s : m->payload.pieces) m->iov.push_back(ucp_dt_iov_t{const_cast<std::byte*>(s.data()), s.size()});
    rp.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    rp.datatype = ucp_dt_make_iov();
    data = m->iov.data();
    count = m->iov.size();
  }
  ucs_status_ptr_t r = ucp_am_send_nbx(p.ep, kAmId, m->header.data(), m->header.size(), data, count, &rp);
  if (UCS_PTR_IS_PTR(r)) {
    ++p.posted;
    in_flight_.insert(m.release());
    return;
  }
  m->release();
  if (UCS_PTR_IS_ERR(r)) lose(id, p, ucs_err("send failed", UCS_PTR_STATUS(r)));
}

void UcxTransport::on_sent(void* req, ucs_status_t /*status*/, void* user_data) {
  auto* m = static_cast<OutMsg*>(user_data);
  m->owner->in_flight_.erase(m);
  if (auto it = m->owner->peers_.find(m->peer); it != m->owner->peers_.end()) {
    --it->second.posted;
    if (!it->second.waiting.empty()) m->owner->freed_.push_back(m->peer);
  }
  m->release();
  delete m;
  ucp_request_free(req);
}

ucs_status_t UcxTransport::on_am(void* arg, const void* header, size_t header_length, void* data, size_t length,
                        const ucp_am_recv_param_t* param) {
  return static_cast<UcxTransport*>(arg)->arrived(header, header_length, data, length, *param);
}

ucs_status_t UcxTransport::arrived(const void* header, size_t hlen, void* data, size_t len,
                                   const ucp_am_recv_param_t& prm) {
  if (hlen < kPrefix) return UCS_OK;
  PeerId id = 0;
  uint64_t token = 0;
  std::memcpy(&id, header, 8);
  std::memcpy(&token, static_cast<const std::byte*>(header) + 8, 8);
  auto it = peers_.find(id);
  // Not a connection of ours (dropped, or a stranger that guessed an id): its token is not the one we issued.
  if (it == peers_.end() || it->second.token != token) return UCS_OK;
  Peer& p = it->second;
  // The dialer is up once it has sent its proof, so its first messages may overtake the proof: keep them (up to a
  // bound) until the proof is read; they are delivered only if it holds.
  if (p.state != Peer::State::up && p.state != Peer::State::proving) return UCS_OK;
  if (p.state == Peer::State::proving && p.inbox.size() >= kMaxUnprovenMessages) {
    refuse(id, p, "sent " + std::to_string(kMaxUnprovenMessages) + " messages without finishing its handshake");
    return UCS_OK;
  }
  hlen -= kPrefix;
  if (opts_.max_message_bytes > 0 && hlen + len > opts_.max_message_bytes) {
    lose(id, p, "dropped: sent a message of " + std::to_string(hlen + len) + " bytes, over the limit of " +
                    std::to_string(opts_.max_message_bytes));
    return UCS_OK;
  }
  auto m = std::make_shared<InMsg>();
  m->owner = this;
  m->in.peer = id;
  const auto* h = static_cast<const std::byte*>(header) + kPrefix;
  m->in.header.assign(h, h + hlen);
  m->size = len;
  if (len > 0 && p.state == Peer::State::up) m->dest = landing(id, m->in.header, len);
  if (len > 0 && !m->dest) m->buf = pool_->acquire(len);
  p.inbox.push_back(m);
  if (prm.recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    m->desc = data;  // fetched right after this callback (zero-copy into our buffer, or the sink's)
    fetch_.push_back(std::move(m));
    return UCS_INPROGRESS;
  }
  // Eager: small, and UCX's buffer is reused when we return, so one copy, into the sink's destination if any.
  if (len > 0) std::memcpy(m->target(), data, len);
  m->state = InMsg::State::ready;
  deliver(id);
  return UCS_OK;
}

void UcxTransport::fetch_rendezvous() {
  while (!fetch_.empty()) {
    std::shared_ptr<InMsg> m = pop_front(fetch_);
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.recv_am = &UcxTransport::on_fetched;
    auto* holder = new std::shared_ptr<InMsg>(m);
    rp.user_data = holder;
    ucs_status_ptr_t r = ucp_am_recv_data_nbx(worker_, m->desc, m->target(), m->size, &rp);
    m->desc = nullptr;
    if (UCS_PTR_IS_PTR(r)) {
      ++fetching_;
      continue;
    }
    delete holder;
    fetched(*m, UCS_PTR_STATUS(r));
  }
}

void UcxTransport::on_fetched(void* req, ucs_status_t status, size_t /*length*/, void* user_data) {
  auto* holder = static_cast<std::shared_ptr<InMsg>*>(user_data);
  --(*holder)->owner->fetching_;
  (*holder)->owner->fetched(**holder, status);
  delete holder;
  ucp_request_free(req);
}

// A rendezvous fetch ended. One that failed loses its message; when that message was to land in the owner's memory
// the owner waits for it, so the connection is lost (and named) rather than left one answer short. Not while
// closing: close() itself cancels what is in flight.
void UcxTransport::fetched(InMsg& m, ucs_status_t status) {
  m.state = status == UCS_OK ? InMsg::State::ready : InMsg::State::failed;
  if (m.state == InMsg::State::failed && m.dest && !closing_)
    if (auto it = peers_.find(m.in.peer); it != peers_.end())
      return lose(it->first, it->second, ucs_err("the payload of a message could not be fetched", status));
  deliver(m.in.peer);
}

// The sink's destination for a payload of `len` bytes, when it names one of exactly that size.
std::byte* UcxTransport::landing(PeerId id, std::span<const std::byte> header, size_t len) {
  if (!sink_) return nullptr;
  const std::optional<std::span<std::byte>> at = sink_(id, header, len);
  return at && at->size() == len ? at->data() : nullptr;
}

// Moves the peer's complete messages, in arrival order, to the event queue; its disconnection after the last.
// Nothing of a connection that has not proved itself.
void UcxTransport::deliver(PeerId id) {
  auto it = peers_.find(id);
  if (it == peers_.end()) return;
  Peer& p = it->second;
  if (!p.was_up) {
    if (p.state == Peer::State::failed) p.inbox.clear();
    if (p.state != Peer::State::failed || p.reported) return;
  }
  while (!p.inbox.empty() && (p.inbox.front()->state != InMsg::State::receiving || p.state == Peer::State::failed)) {
    std::shared_ptr<InMsg> m = pop_front(p.inbox);
    if (m->state != InMsg::State::ready) continue;  // cut off by the peer's loss
    if (m->dest) m->in.payload = std::make_unique<LandedPayload>(std::span(m->dest, m->size));
    else if (m->size > 0) m->in.payload = std::make_unique<PooledPayload>(std::move(m->buf), m->size);
    events_.push_back(std::move(m->in));
  }
  if (p.state == Peer::State::failed && p.inbox.empty() && !p.reported) {
    p.reported = true;
    Incoming e;
    e.kind = Incoming::Kind::disconnected;
    e.peer = id;
    e.detail = p.addr.empty() ? p.failure : p.addr + " (" + p.failure + ")";
    events_.push_back(std::move(e));
  }
}
}  // namespace commsched::ps::ucx
