#include "comm_backends/control/van.h"

#include <algorithm>
#include <array>
#include <sstream>

#include "comm_backends/control/socket.h"

namespace commsched::control {
namespace {
using namespace ps;
using std::chrono::duration;
using std::chrono::duration_cast;
using std::chrono::milliseconds;

std::string port_of(const std::string& endpoint) { return endpoint.substr(endpoint.rfind(':') + 1); }
}  // namespace

std::string payload_text(const ps::Payload* p) {
  if (!p) return {};
  auto b = p->bytes();
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

VanOptions VanOptions::from(const ClusterEnv& env) {
  VanOptions o;
  o.role = env.role == Role::server ? PeerRole::server : PeerRole::worker;
  o.rank = static_cast<uint32_t>(env.rank);
  o.num_workers = env.num_workers;
  o.num_servers = env.num_servers;
  o.timeout_s = env.timeout_s;
  if (o.role == PeerRole::server) {
    o.bind_host = control::bind_host(env);
    o.advertised_host = control::advertised_host(env);
  }
  return o;
}

Van::Van(VanOptions opts, Transport& transport, VanProtocol& protocol, Store& store)
    : opts_(std::move(opts)),
      transport_(transport),
      protocol_(protocol),
      store_(store),
      live_(opts_.timeout_s),
      heartbeat_(heartbeat_interval(opts_.timeout_s, opts_.heartbeat_s)) {}

std::string Van::start() {
  const Clock::time_point now = Clock::now();
  started_ = opts_.rendezvous_began == Clock::time_point{} ? now : opts_.rendezvous_began;
  next_tick_ = now + heartbeat_;
  next_store_check_ = now;
  const Deadline deadline = started_ + duration_cast<Clock::duration>(duration<double>(opts_.rendezvous_timeout_s));
  if (opts_.role == PeerRole::worker) {
    // Every endpoint before any dial: a worker that is a member of some servers must answer their pings, which it
    // cannot while it waits here.
    std::vector<std::string> endpoints;
    for (uint32_t s = 0; s < static_cast<uint32_t>(opts_.num_servers); ++s) {
      auto endpoint = endpoint_of(s, deadline);
      if (!endpoint) return {};
      endpoints.push_back(std::move(*endpoint));
    }
    for (uint32_t s = 0; s < endpoints.size(); ++s) dial(s, endpoints[s]);
    return {};
  }
  roster_.expect(PeerRole::worker, 0, static_cast<uint32_t>(opts_.num_workers));
  const std::string endpoint = "tcp://" + opts_.advertised_host + ":" + port_of(transport_.bind(opts_.bind_host, 0));
  if (opts_.rank == 0) {
    roster_.expect(PeerRole::server, 1, static_cast<uint32_t>(opts_.num_servers - 1));
  } else {
    // The root first, then our own endpoint: no worker dials us before we can answer its pings.
    auto root = endpoint_of(0, deadline);
    if (!root) return endpoint;
    dial(0, *root);
  }
  publish("server/" + std::to_string(opts_.rank), endpoint);
  return endpoint;
}

std::optional<std::string> Van::endpoint_of(uint32_t server, Deadline deadline) {
  const std::string k = key("server/" + std::to_string(server));
  try {
    return store_.get(k, deadline);
  } catch (const std::exception& e) {
    if (Clock::now() < deadline) store_failed(e);
    else fail(rendezvous_timeout("server " + std::to_string(server) + " to publish its endpoint ('" + k + "' in the " +
                                 store_.where() + ")"));
    return std::nullopt;
  }
}

// A dialed server is a member from the start: this node knows who is there, and its silence counts from now.
void Van::dial(uint32_t server, const std::string& endpoint) {
  const PeerId id = transport_.connect(endpoint);
  roster_.add(id, {PeerRole::server, server});
  watch(id, Clock::now());
  send(id, hello());
}

void Van::publish(const std::string& name, const std::string& value) {
  try {
    store_.set(key(name), value);
  } catch (const std::exception& e) {
    store_failed(e);
  }
}

// The store's errors name it (an answer that never came, a connection that ended).
void Van::store_failed(const std::exception& e) { fail(Status::Error(std::string("rendezvous failed: ") + e.what())); }

// Workers: ready once the root has published that the whole job has come.
void Van::check_assembled(Clock::time_point now) {
  if (now < next_store_check_) return;
  try {
    if (store_.try_get(key("assembled"))) {
      ready_ = true;
      return protocol_.on_ready();
    }
  } catch (const std::exception& e) {
    return store_failed(e);
  }
  store_backoff_ = std::min(store_backoff_ * 2, milliseconds(20));
  next_store_check_ = now + store_backoff_;
}

Status Van::rendezvous_timeout(const std::string& waiting_for) const {
  std::ostringstream os;
  os << "rendezvous timed out after " << opts_.rendezvous_timeout_s << " s waiting for " << waiting_for
     << " (COMMSCHED_PS_RENDEZVOUS_TIMEOUT)";
  return Status::Error(os.str());
}

Header Van::hello() const {
  Header h = header(MsgType::hello);
  h.aux = opts_.settings;
  return h;
}

// A member with other settings: admitted first, so that it too is told why the rendezvous fails.
void Van::check_settings(PeerId id, const Header& h) {
  if (h.aux == opts_.settings) return;
  const auto describe = [this](uint32_t s) {
    return opts_.describe_settings ? opts_.describe_settings(s) : "settings " + std::to_string(s);
  };
  fail(Status::Error(name(id) + " runs with " + describe(h.aux) + " but " + peer_name(opts_.role, opts_.rank) +
                     " with " + describe(opts_.settings) + ": every worker and server must use the same"));
}

bool Van::poll(milliseconds max_wait) {
  if (failed()) return false;
  auto now = Clock::now();
  const bool awaiting_store = !ready_ && opts_.role == PeerRole::worker;
  auto until = next_tick_;
  if (awaiting_store) until = std::min(until, next_store_check_);
  const auto wait = until > now ? duration_cast<milliseconds>(until - now) : milliseconds(0);
  if (auto in = transport_.receive(live_.poll_wait(std::min(max_wait, wait), now))) handle(*in);
  if (failed()) return false;
  now = Clock::now();
  if (auto loss = live_.check(now)) lost(loss->peer, loss->explain([this](PeerId id) { return name(id); }));
  if (!failed() && awaiting_store) check_assembled(now);
  if (!failed() && !ready_ && now - started_ > duration<double>(opts_.rendezvous_timeout_s))
    fail(rendezvous_timeout(opts_.role == PeerRole::worker ? "server 0 to see every worker and server ('" +
                                                                 key("assembled") + "' in the " + store_.where() + ")"
                                                           : names(roster_.missing())));
  if (!failed() && now >= next_tick_) tick(now);
  return !failed();
}

// Pings also probe: an unroutable peer is reported as gone by the transport.
void Van::tick(Clock::time_point now) {
  std::array<std::byte, kHeaderBytes> ping;
  encode_header(header(MsgType::ping), ping);
  for (PeerId id : live_.expected()) transport_.send_ping(id, ping);
  next_tick_ = now + heartbeat_;
}

void Van::leave() {
  if (failed()) return;
  bye_.leave();
  for (PeerId id : live_.expected()) send(id, header(MsgType::bye));
  const auto deadline = Clock::now() + duration<double>(opts_.timeout_s);
  // expected() holds exactly the members that have neither answered nor ended their connection: an answer or an end
  // makes live_ forget the member.
  while (!failed() && !live_.expected().empty()) {
    const auto now = Clock::now();
    if (now >= deadline) {
      std::ostringstream os;
      os << "closing after " << opts_.timeout_s << " s without an answering bye from every member (COMMSCHED_TIMEOUT)";
      log(os.str());
      break;
    }
    const auto wait = std::min(heartbeat_, duration_cast<milliseconds>(deadline - now) + milliseconds(1));
    if (auto in = transport_.receive(wait)) handle(*in);
  }
  if (!failed()) transport_.close(true);  // a failure meanwhile has closed it
}

bool Van::all_left(PeerRole role) const {
  if (!ready_) return false;
  for (PeerId id : roster_.ids(role))
    if (!bye_.left(id)) return false;
  return true;
}

std::string Van::name(PeerId peer) const {
  const Roster::Member* m = roster_.find(peer);
  const std::string addr = transport_.describe(peer);
  const std::string n = m ? peer_name(m->role, m->rank) : "unregistered peer";
  return addr.empty() ? n : n + " (" + addr + ")";
}

void Van::send(PeerId peer, const Header& h, OutPayload payload) {
  std::array<std::byte, kHeaderBytes> buf;
  encode_header(h, buf);
  transport_.send(peer, buf, std::move(payload));
}

void Van::send_text(PeerId peer, const Header& h, std::string text) {
  if (text.size() > kMaxTextPayload) text.resize(kMaxTextPayload);
  auto owned = std::make_shared<std::string>(std::move(text));  // lives until the transport lets go of it
  send(peer, h, OutPayload{reinterpret_cast<const std::byte*>(owned->data()), owned->size(), [owned] {}});
}

void Van::handle(Incoming& in) {
  const Roster::Member* member = roster_.find(in.peer);
  if (in.kind == Incoming::Kind::dropped) {
    if (member) return lost(in.peer, in.detail);  // a member refused our handshake
    return log(in.detail);
  }
  if (dropped_.count(in.peer)) return;
  if (in.kind == Incoming::Kind::disconnected) {
    if (!bye_.ended(in.peer)) live_.closed(in.peer, Clock::now());  // a loss once the grace runs out
    else live_.forget(in.peer);  // gone as announced: a leaving node waits for nothing more from it
    return;
  }
  std::optional<uint64_t> psize;
  if (in.payload) psize = in.payload->bytes().size();
  Decoded d = decode_header(in.header, psize, DecodeLimits{opts_.max_message_bytes});
  if (!d.header) return malformed(in.peer, d.error);
  if (in.extra_frames) return malformed(in.peer, std::to_string(in.extra_frames) + " unexpected extra frame(s)");
  const Header& h = *d.header;
  if (!member) {
    if (h.type != MsgType::hello) return drop(in.peer, "first message is " + std::string(msg_type_name(h.type)) + ", not hello");
    return on_hello(in.peer, h);
  }
  if (h.sender_role != member->role || h.sender_rank != member->rank)
    return malformed(in.peer, "sender changed from " + peer_name(member->role, member->rank) + " to " +
                                  peer_name(h.sender_role, h.sender_rank));
  live_.heard(in.peer, Clock::now());
  on_member_message(in.peer, *member, h, std::move(in.payload));
}

void Van::on_member_message(PeerId id, const Roster::Member& m, const Header& h, std::unique_ptr<Payload> p) {
  switch (h.type) {
    case MsgType::ping: return;
    case MsgType::bye:
      if (!bye_.said_bye(id)) return;  // a repeat: no news
      live_.forget(id);                // gone as announced: neither pinged nor judged any more
      // Answered, so the member may close once it hears its bye arrived; a leaving node has said its own already.
      if (!bye_.leaving()) send(id, header(MsgType::bye));
      return;
    case MsgType::hello: return malformed(id, "said hello twice");
    case MsgType::peer_lost:
      return stop(relay_.reported(payload_text(p.get()), id, name(id), live_.expected()), Status::Code::peer_lost);
    default: return protocol_.on_message(id, m, h, std::move(p));
  }
}

void Van::on_hello(PeerId id, const Header& h) {
  if (auto why = roster_.admit(id, {h.sender_role, h.sender_rank}))
    return drop(id, "hello from " + peer_name(h.sender_role, h.sender_rank) + " refused: " + *why);
  watch(id, Clock::now());
  check_settings(id, h);
  if (failed()) return;
  maybe_ready();
}

// Servers: once every awaited member has said hello. The root then tells the workers that the job has come.
void Van::maybe_ready() {
  if (ready_ || !roster_.complete()) return;
  if (opts_.rank == 0) publish("assembled", std::to_string(opts_.num_workers));
  if (failed()) return;
  ready_ = true;
  protocol_.on_ready();
}

void Van::malformed(PeerId id, const std::string& why) {
  if (roster_.find(id)) return fail(Status::Error(name(id) + " sent a malformed message: " + why), id);
  drop(id, why);
}

void Van::drop(PeerId id, const std::string& why) {
  log("dropping connection from " + name(id) + ": " + why + "; still serving the others");
  send_text(id, header(MsgType::error), "connection dropped by " + peer_name(opts_.role, opts_.rank) + ": " + why);
  dropped_.insert(id);
}

// A member from now on: its silence is judged (counting from `heard`), its goodbye awaited.
void Van::watch(PeerId id, Clock::time_point heard) {
  live_.watch(id, heard);
  bye_.await(id);
}

void Van::lost(PeerId id, const std::string& why) {
  fail(Status::Error(LossRelay::lost(name(id), why), Status::Code::peer_lost), id);
}

// No member has PeerId 0, so culprit 0 spares nobody.
void Van::fail(const Status& status, PeerId culprit) {
  stop(relay_.noticed(status.message, culprit, live_.expected()), status.code);
}

// The first failure only (the relay drops repeats): tell who the relay says, then fail.
void Van::stop(std::optional<LossRelay::Verdict> verdict, Status::Code code) {
  if (!verdict) return;
  for (PeerId id : verdict->tell) send_text(id, header(MsgType::peer_lost), verdict->message);
  protocol_.on_failed(Status::Error(verdict->message, code));
  transport_.close(true);
}

void Van::log(const std::string& line) const {
  if (opts_.log) opts_.log(line);
}

}  // namespace commsched::control
