// The UCX transport (ucx_transport_impl.h says how it works): the Transport calls, UCX's setup and close, and the
// I/O loop that progresses UCX and polls the sockets.
#include "comm_backends/ps/ucx_transport_impl.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>
#include <ucs/debug/log_def.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <utility>

#include "comm_backends/cluster_auth.h"
#include "comm_backends/control/socket.h"
#include "comm_backends/ps/ucx_defaults.h"

namespace commsched::ps::ucx {

thread_local bool in_close = false;

namespace {

// Our endpoints run without UCX error handling (shared memory has none in UCX 1.13), so UCX logs two ordinary events
// as errors. This handler, run before UCX's own, takes exactly those; every other message goes on to UCX's handler.
//  - A peer process dies while UCX copies from or into its memory (a CMA rendezvous: process_vm_readv/writev fail
//    with ESRCH): logged at FATAL level, and UCX's default handler aborts the survivor with a backtrace. That death
//    is an ordinary lost peer (its socket ends at once and the protocol names it): one line on stderr, and the copy
//    fails normally.
//  - A peer ends its connection while close() flushes its endpoint: "error during flush: Endpoint timeout", at
//    ERROR level, in about one clean shutdown in ten over UCX's TCP transport (a worker exits the moment the
//    server's answering goodbye reaches it, while the server flushes). The goodbyes already settled what each side
//    needed, and a loss before them was reported by the protocol. Dropped, only inside close().
ucs_log_func_rc_t filter_ucx_log(const char* file, unsigned, const char*, ucs_log_level_t level,
                                 const ucs_log_component_config_t*, const char* format, va_list ap) {
  if (!file) return UCS_LOG_FUNC_RC_CONTINUE;
  if (in_close && level == UCS_LOG_LEVEL_ERROR && std::strstr(file, "flush.c") &&
      std::strstr(format, "error during flush"))
    return UCS_LOG_FUNC_RC_STOP;
  if (level != UCS_LOG_LEVEL_FATAL || !std::strstr(file, "cma_ep.c")) return UCS_LOG_FUNC_RC_CONTINUE;
  char text[512];
  va_list copy;
  va_copy(copy, ap);
  std::vsnprintf(text, sizeof text, format, copy);
  va_end(copy);
  if (!std::strstr(text, std::strerror(ESRCH))) return UCS_LOG_FUNC_RC_CONTINUE;
  std::fprintf(stderr, "[commsched ps ucx] a peer process exited during a shared-memory copy (%s); its connection "
               "reports the loss\n", text);
  return UCS_LOG_FUNC_RC_STOP;
}

void install_log_handler_once() {
  static std::once_flag once;
  std::call_once(once, [] { ucs_log_push_handler(filter_ucx_log); });
}

// "tcp://host:port" (or "ucx://host:port") to a socket address.
sockaddr_in parse_endpoint(const std::string& ep) {
  const auto scheme = ep.find("://");
  const auto colon = ep.rfind(':');
  if (scheme == std::string::npos || colon == std::string::npos || colon <= scheme + 3)
    throw std::runtime_error("UCX transport: endpoint '" + ep + "' is not tcp://host:port");
  int port = 0;
  try {
    port = std::stoi(ep.substr(colon + 1));
  } catch (const std::exception&) {
    throw std::runtime_error("UCX transport: endpoint '" + ep + "' has no port");
  }
  try {
    return control::resolve_ipv4(ep.substr(scheme + 3, colon - scheme - 3), port);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("UCX transport: endpoint '" + ep + "': " + e.what());
  }
}

// Our defaults for UCX settings the user left unset (a UCX_* variable always wins). Over shared memory only, UCX's
// automatic rendezvous threshold is 8 KiB: every bigger message waits for a round trip (RTS, the receiver's CMA read,
// ATS) before it completes, which on a busy machine costs more than copying a few fragments through the shared FIFO.
// Measured with ps_goodput ps-server / ps-worker (1 worker, separate processes, 16 MiB per size, 3 alternated runs,
// load 8): 16-32 KiB partitions 148-415 MB/s eagerly below 64 KiB against 56-182 MB/s with UCX's threshold. Eager
// up to 256 KiB helped one worker more, but made 4 workers' 64 KiB pushes 2-4x slower: their fragments share the
// server's one FIFO (64 slots of 8 KiB), and senders that find it full only retry when they progress.
//
// A PS worker's sends over shared memory only use the put scheme (TransportOptions::sender_writes_rendezvous): in UCX
// 1.13 the sender's scheme decides who copies, so the worker writes each push into the server's pooled buffer and
// reads each sum back from one (the server's sends keep UCX's get). Both CMA copies then pin the server's huge-page
// buffers (buffer_pool.cc), never the worker's 4 KiB-page tensors, and the server's I/O thread copies nothing: with
// many workers the copies spread over their threads instead of queueing on the server's. ps_goodput ps-server and
// ps-worker (separate processes, 1, 4 and 16 MiB, 512 MiB each), huge-page pool both sides, get against the worker's
// put alternated, 4 pairs at load 11: the server's CPU time 345-509 -> 25-49 ms, both processes' 662-866 -> 559-651
// ms, median goodput 966 -> 1112 (1 MiB), 1104 -> 1296 (4 MiB), 661 -> 926 MB/s (16 MiB). Quiet too (load 1.4-4,
// ps_goodput transports, 3 pairs) the put was ahead in every pair: 0.24-0.40 -> 0.41-0.58 of memcpy at 1-16 MiB.
void apply_defaults(ucp_config_t* config, const TransportOptions& o) {
  for (const UcxSetting& d : ucx_default_settings(std::getenv("UCX_TLS"), o.sender_writes_rendezvous))
    if (auto s = ucp_config_modify(config, d.name.c_str(), d.value.c_str()); s != UCS_OK)
      throw std::runtime_error(ucs_err("setting UCX_" + d.name + "=" + d.value, s));
}

}  // namespace

UcxTransport::UcxTransport(const TransportOptions& o) : opts_(o), bucket_(o.emulate_rate_bps, 256.0 * 1024) {
  if (!opts_.auth_secret.empty()) (void)ClusterAuth::derive(opts_.auth_secret, kProofPurpose);  // sodium ready
  install_log_handler_once();
  ucp_config_t* config = nullptr;
  if (auto s = ucp_config_read(nullptr, nullptr, &config); s != UCS_OK) throw std::runtime_error(ucs_err("ucp_config_read", s));
  apply_defaults(config, opts_);
  ucp_params_t p{};
  p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME;
  p.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  p.mt_workers_shared = 0;
  p.name = "commsched-ps";
  const ucs_status_t s = ucp_init(&p, config, &ctx_);
  ucp_config_release(config);
  if (s != UCS_OK) throw std::runtime_error(ucs_err("ucp_init (check UCX_TLS)", s));
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  if (auto ws = ucp_worker_create(ctx_, &wp, &worker_); ws != UCS_OK) {
    ucp_cleanup(ctx_);
    throw std::runtime_error(ucs_err("ucp_worker_create", ws));
  }
  ucp_am_handler_param_t h{};
  h.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  h.id = kAmId;
  h.cb = &UcxTransport::on_am;
  h.arg = this;
  check(ucp_worker_set_am_recv_handler(worker_, &h), "ucp_worker_set_am_recv_handler");
  check(ucp_worker_get_efd(worker_, &efd_), "ucp_worker_get_efd");
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  check(ucp_worker_get_address(worker_, &addr, &len), "ucp_worker_get_address");
  const auto* a = reinterpret_cast<const std::byte*>(addr);
  address_.assign(a, a + len);
  ucp_worker_release_address(worker_, addr);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw std::runtime_error("eventfd failed: " + std::string(std::strerror(errno)));
}

UcxTransport::~UcxTransport() {
  close(false);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

std::string UcxTransport::bind(const std::string& host, int port) {
  if (listen_fd_ >= 0) throw std::runtime_error("transport already bound");
  control::Fd fd;
  try {
    fd = control::listen_tcp(host, port);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("UCX transport: " + std::string(e.what()));
  }
  control::set_nonblocking(fd.get(), true);
  listen_fd_ = fd.release();
  return "tcp://" + control::bound_address(listen_fd_);
}

PeerId UcxTransport::connect(const std::string& endpoint) {
  const PeerId id = next_peer_++;
  Peer& p = peers_[id];
  p.dial = parse_endpoint(endpoint);
  p.addr = endpoint.substr(endpoint.find("://") + 3);
  start_dial(id, p);
  return id;
}

void UcxTransport::send(PeerId peer, std::span<const std::byte> header, OutPayload payload) {
  if (!worker_) {  // closed
    if (payload.release) payload.release();
    return;
  }
  auto m = out_msg(peer, header, std::move(payload));
  if (bucket_.enabled()) {
    backlog_.push_back(std::move(m));
    flush_backlog();
  } else {
    dispatch(std::move(m));
  }
}

void UcxTransport::send_ping(PeerId peer, std::span<const std::byte> header) {
  if (worker_) dispatch(out_msg(peer, header, {}));  // never behind the emulated link's backlog
}

std::optional<Incoming> UcxTransport::receive(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  if (!worker_) return std::nullopt;  // closed
  // What an earlier progress took out of UCX goes first: progressing and polling the sockets again before each event
  // (a poll syscall per message) was most of a small message's cost.
  if (!events_.empty()) return pop_event();
  for (;;) {
    progress();
    if (!events_.empty()) return pop_event();
    if (took_wake()) return std::nullopt;
    const auto now = Clock::now();
    if (now >= deadline) return std::nullopt;
    long wait = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;
    if (!backlog_.empty()) wait = std::min<long>(wait, static_cast<long>(bucket_.wait_s(now) * 1000) + 1);
    if (redial_pending_) wait = std::min<long>(wait, kRedialDelay.count());
    // Sends UCX could not start yet (a full shared-memory FIFO) advance only when we progress, and no event says
    // when there is room: while any are outstanding, look again every millisecond.
    if (!in_flight_.empty()) wait = std::min<long>(wait, 1);
    // Traffic comes in bursts and every rendezvous takes a round trip: keep polling for 100 us after the last
    // progress instead of paying a sleep and a wake-up per message (64 KiB messages over shared memory: ~0.2 GB/s
    // sleeping at once, ~2 GB/s with the spin, on a loaded 2-core machine). An idle transport sleeps.
    if (now - last_progress_ < spin_) {
      sched_yield();
      continue;
    }
    const ucs_status_t armed = ucp_worker_arm(worker_);
    if (armed == UCS_ERR_BUSY && !stuck_on_peers()) continue;  // more to progress first
    // Stuck: nothing moved for a spin's length and UCX still cannot sleep because sends wait for room in a peer's
    // shared FIFO. Only that peer's progress makes room and no event says when, so nap briefly instead of spinning:
    // spinning senders took the cores the receiving server needed (4 workers over shared memory at 4-16 KiB: ~10x
    // slower than ZeroMQ). UCX's event fd stays out of that nap: unarmed, it can be readable all along (peers signal
    // each message they put in our FIFO), and the nap would end at once (4.6 million polls a second, a spin again).
    const auto most = std::chrono::microseconds(wait * 1000);
    if (armed == UCS_ERR_BUSY) poll_sockets(std::min(most, kStuckNap), false);
    else poll_sockets(armed == UCS_OK ? most : std::min(most, std::chrono::microseconds(1000)));
  }
}

// Sends are outstanding (in UCX, or held back by the per-peer limit) and progress found nothing to do.
bool UcxTransport::stuck_on_peers() const { return !in_flight_.empty(); }

// Only the first wake() since the I/O thread last looked writes the eventfd (the PS worker wakes once per batch
// started); the flag is what counts, the eventfd only ends a sleeping poll.
void UcxTransport::wake() {
  if (wake_flag_.exchange(true)) return;
  uint64_t one = 1;
  [[maybe_unused]] auto r = ::write(wake_fd_, &one, sizeof one);
}

bool UcxTransport::took_wake() { return wake_flag_.exchange(false); }

void UcxTransport::close(bool graceful) {
  sink_ = nullptr;  // nothing arriving from here on lands in the owner's memory
  if (!worker_) return;
  closing_ = true;
  in_close = true;
  struct Reset { ~Reset() { in_close = false; } } reset;  // later UCX messages of this thread: judged as before
  const auto deadline = Clock::now() + kGracefulLinger;
  if (graceful) {
    while (!backlog_.empty()) dispatch(pop_front(backlog_));
    // Also let the fetches of arriving messages finish: force-closing an endpoint while its peer still moves a
    // rendezvous payload to us made UCX 1.13's TCP transport abort the peer (tcp_ep.c PUT_TX_WAITING_ACK).
    while ((!in_flight_.empty() || any_waiting() || fetching_ > 0) && Clock::now() < deadline) progress_or_nap();
    flush_all(deadline);  // what UCX reported sent has reached the peers before their sockets end
  }
  std::vector<void*> closing;
  for (auto& [id, p] : peers_) {
    if (p.ep) closing.push_back(close_ep(p.ep));
    p.ep = nullptr;
    close_fd(p);
  }
  for (ucp_ep_h ep : retiring_) closing.push_back(close_ep(ep));
  retiring_.clear();
  const auto close_deadline = Clock::now() + std::chrono::milliseconds(200);
  for (void* r : closing) {
    while (r && ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < close_deadline) progress_or_nap();
    if (r) ucp_request_free(r);  // one still closing is freed by UCX when it finishes
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
  for (auto& m : fetch_) ucp_am_data_release(worker_, m->desc);
  fetch_.clear();
  // Completes what is still outstanding (callbacks run here). From here on UCX writes into no destination the
  // sink gave: a rendezvous fetch has finished or is gone with the worker (the owner may free its memory).
  ucp_worker_destroy(worker_);
  worker_ = nullptr;
  ucp_cleanup(ctx_);
  ctx_ = nullptr;
  // UCX is gone: nothing reads any payload any more, whether or not its completion was reported.
  for (OutMsg* m : in_flight_) m->release(), delete m;
  in_flight_.clear();
  for (auto& m : backlog_) m->release();
  backlog_.clear();
  for (auto& [id, p] : peers_)
    for (auto& m : p.waiting) m->release();
  peers_.clear();
  events_.clear();
}

std::string UcxTransport::describe(PeerId peer) const {
  auto it = peers_.find(peer);
  return it == peers_.end() ? std::string() : it->second.addr;
}

void UcxTransport::check(ucs_status_t s, const char* what) {
  if (s != UCS_OK) throw std::runtime_error(ucs_err(what, s));
}

bool UcxTransport::any_waiting() const {
  for (auto& [id, p] : peers_)
    if (!p.waiting.empty() && p.state != Peer::State::failed) return true;
  return false;
}

void UcxTransport::drain_ucx() {
  for (;;) {
    unsigned n = 0;
    while (ucp_worker_progress(worker_)) ++n;
    post_freed();
    const bool fetched = !fetch_.empty();
    fetch_rendezvous();
    if (n == 0 && !fetched) break;
    last_progress_ = Clock::now();
  }
}

// The sockets only carry handshakes and liveness, so a busy loop looks at them every kSocketPollEvery, not at every
// turn (a poll syscall each).
void UcxTransport::progress() {
  flush_backlog();
  drain_ucx();
  if (Clock::now() - last_socket_poll_ >= kSocketPollEvery) poll_sockets(std::chrono::microseconds(0));
  close_retired();
  redial_due();
}

void UcxTransport::progress_or_nap() {
  progress();
  if (ucp_worker_arm(worker_) == UCS_OK) poll_sockets(std::chrono::milliseconds(1));
}

// Handles whatever the sockets have (accepts, hellos, ends); waits up to `timeout`, or until wake() or (with
// ucx_events, after an arm) UCX has something. The eventfd is only drained here: whether a wake is pending is
// wake_flag_'s to say (took_wake), wherever it is looked at.
void UcxTransport::poll_sockets(std::chrono::microseconds timeout, bool ucx_events) {
  last_socket_poll_ = Clock::now();
  fds_.clear();
  fd_peer_.clear();
  fds_.push_back({wake_fd_, POLLIN, 0});
  fds_.push_back({efd_, static_cast<short>(ucx_events ? POLLIN : 0), 0});
  fds_.push_back({listen_fd_, POLLIN, 0});
  for (auto& [id, p] : peers_) {
    if (p.fd < 0) continue;
    fds_.push_back({p.fd, static_cast<short>(p.state == Peer::State::dialing ? POLLOUT : POLLIN), 0});
    fd_peer_.push_back(id);
  }
  const auto us = std::min<long long>(timeout.count(), 1ll << 40);
  const timespec ts{static_cast<time_t>(us / 1000000), static_cast<long>(us % 1000000) * 1000};
  if (::ppoll(fds_.data(), fds_.size(), &ts, nullptr) <= 0) return;
  if (fds_[2].revents & POLLIN) accept_all();
  for (size_t i = 3; i < fds_.size(); ++i) {
    if (!fds_[i].revents) continue;
    const PeerId id = fd_peer_[i - 3];
    Peer& p = peers_[id];
    if (p.fd != fds_[i].fd) continue;
    if (p.state == Peer::State::dialing) dialed(id, p);
    else readable(id, p);
  }
  if (fds_[0].revents & POLLIN) {
    uint64_t v;
    [[maybe_unused]] auto r = ::read(wake_fd_, &v, sizeof v);
  }
}
}  // namespace commsched::ps::ucx

namespace commsched::ps {

std::unique_ptr<Transport> make_ucx_transport(const TransportOptions& opts) {
  return std::make_unique<ucx::UcxTransport>(opts);
}

}  // namespace commsched::ps
