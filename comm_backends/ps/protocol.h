// Parameter-server wire protocol: a fixed, versioned 88-byte header frame followed (for data messages) by one payload
// frame. Pure byte manipulation; no transport header is included here, so ZeroMQ and RDMA share it.
//
// Layout (little-endian):
//   0 magic u32 'CSPS' | 4 version u16 | 6 type u8 | 7 dtype u8 | 8 sender_role u8 | 9 flags u8 | 10 codec u8
//  11 reserved u8 (0)  | 12 sender_rank u32 | 16 key u64 | 24 offset u64 | 32 length u64 | 40 tensor_bytes u64
//  48 iteration u64    | 56 round u64 | 64 request_id u64 | 72 aux u32 | 76 elements u32 | 80 priority i32
//  84 reserved u32 (0)
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/types.h"

namespace commsched::ps {

inline constexpr uint32_t kMagic = 0x53505343;  // "CSPS" read as little-endian bytes
// 2: `received` and kFlagAckReceipt; 3: codec and elements; 4: kFlagAsync, lags; 5: push_pull_batch, sum_batch;
// 6: servers' endpoints through the rendezvous store (no peers message, hellos carry no text); 7: priority
inline constexpr uint16_t kVersion = 7;
inline constexpr size_t kHeaderBytes = 88;

enum class MsgType : uint8_t {
  hello = 1,         // introduction on a connection the sender dialed: sender_role, sender_rank; no payload;
                     // aux: the settings every process must share (PsConfig::mode_word), checked by the receiver
                     // (2 was the root's peer table, before the endpoints went through the rendezvous store)
  assign_req = 3,    // worker -> root: which server owns (key, offset)? length = partition bytes (load estimate)
  assign_rep = 4,    // root -> worker: aux = owning server rank
  push_pull = 5,     // worker -> server: payload = this worker's partition; answered by sum
  sum = 6,           // server -> worker: payload = sum over all workers
  bcast = 7,         // worker -> server: broadcast; payload from the root worker (aux = root rank), empty otherwise
  bcast_data = 8,    // server -> worker: payload = root's data (empty ack for the root itself)
  ping = 9,          // heartbeat; both ends of every connection send one each tick, any message counts as life
  error = 10,        // payload = text; request_id names the failed request (0: the whole connection)
  peer_lost = 11,    // payload = text naming the lost peer; the receiver fails everything
  bye = 12,          // clean departure; the peer's later disconnection is not a failure
  received = 13,     // server -> worker: the push_pull/bcast `request_id` has fully arrived (sent only when the
                     // request carried kFlagAckReceipt); lets the worker release credit before the sum is ready
  join = 14,         // worker -> every server: this worker has no more data until every worker has joined; it stands
                     // in with zeros for the others' push_pulls (Horovod's join)
  joined = 15,       // server -> every worker: every worker has joined; aux = the rank that joined last. Rounds start
                     // again from 0 on every worker afterwards
  lags = 16,         // server -> every worker, each heartbeat while some worker lags (and once when none does any
                     // more): payload = the server's laggards as text (comm_backends/straggler.h)
  push_pull_batch = 17,  // worker -> server: several plain push_pulls in one message (a fused batch's small
                         // partitions); aux = entries, length = payload bytes; payload = batch table + data (below).
                         // Answered once, by one sum_batch of the same layout (or one error naming the key)
  sum_batch = 18,        // server -> worker: the sums of a push_pull_batch, in its layout
};
inline constexpr uint8_t kMaxMsgType = 18;

// Header flags.
inline constexpr uint8_t kFlagAckReceipt = 1;  // push_pull/bcast: answer `received` on arrival, before the sum
// push_pull: a lane of hierarchical mode (comm_backends/hierarchical): the range is one machine's slice, pushed by one
// worker per machine, so the sum is over `aux` contributors (the machines), not over every worker.
inline constexpr uint8_t kFlagLane = 2;
// push_pull: a gradient of an asynchronous or stale-synchronous run (COMMSCHED_PS_MODE=async|ssp): the server answers
// it with the running sum since the sender's last answer (AsyncTable), not with one round's sum of every worker.
inline constexpr uint8_t kFlagAsync = 4;
inline constexpr uint8_t kKnownFlags = kFlagAckReceipt | kFlagLane | kFlagAsync;
std::string_view msg_type_name(MsgType t);

enum class PeerRole : uint8_t { worker = 0, server = 1, tool = 2 };
std::string peer_name(PeerRole role, uint32_t rank);  // "worker 3", "server 1"

struct Header {
  MsgType type = MsgType::ping;
  DType dtype = DType::f32;
  PeerRole sender_role = PeerRole::worker;
  uint8_t flags = 0;
  uint32_t sender_rank = 0;
  uint64_t key = 0;
  uint64_t offset = 0;         // bytes from the start of the tensor (data messages)
  uint64_t length = 0;         // bytes of the range (data messages); must equal the payload frame's size when present
  uint64_t tensor_bytes = 0;   // whole tensor's bytes, to catch workers disagreeing on a tensor's size
  uint64_t iteration = 0;
  uint64_t round = 0;          // per-key submission counter: pushes of the same round are summed together
  uint64_t request_id = 0;     // worker-chosen; echoed in the answer
  uint32_t aux = 0;            // per-type extra (owning server, broadcast root, number of servers, lane contributors)
  // push_pull/sum only: the compression::Scheme the payload is encoded with when the server decodes it to sum (topk,
  // signsgd; the sum comes back encoded the same way and the same size), 0 for plain data. Casts (fp16/bf16) travel
  // as plain data of the narrow dtype. `dtype` stays the tensor's.
  uint8_t codec = 0;
  uint32_t elements = 0;       // with a codec: the range's element count before encoding (0 without)
  // push_pull/bcast and their batch: the partition's priority (Task::priority, lower is more urgent; a batch's: its
  // most urgent entry's), echoed in the answer; the server sends its most urgent ready reply first
  // (scheduler/reply_order.h).
  int32_t priority = 0;
};

// A header of type `t` from this sender; the other fields are zero.
inline Header make_header(MsgType t, PeerRole role, uint32_t rank) {
  Header h;
  h.type = t;
  h.sender_role = role;
  h.sender_rank = rank;
  return h;
}

// Whether messages of this type carry a payload frame whose size must equal header.length.
bool carries_data(MsgType t);
// Whether messages of this type may carry a payload frame at all (text, data).
bool allows_payload(MsgType t);

void encode_header(const Header& h, std::span<std::byte, kHeaderBytes> out);

struct DecodeLimits {
  uint64_t max_payload_bytes = 1ull << 32;  // largest acceptable data range
};

struct Decoded {
  std::optional<Header> header;
  std::string error;  // set when header is empty: what was wrong, with the offending value
};

// Validates every field of a header frame and its payload frame size (nullopt: no payload frame).
// Never reads outside `frame`; never throws on bad input.
Decoded decode_header(std::span<const std::byte> frame, std::optional<uint64_t> payload_bytes,
                      const DecodeLimits& limits = {});

// ---- batches (push_pull_batch, sum_batch) ----
// Payload: `aux` table entries of kBatchEntryBytes, then each entry's bytes in table order, every one starting at a
// multiple of kBatchAlign from the payload's start (zero padding between), so a server sums them in place.
//   entry: 0 key u64 | 8 offset u64 | 16 length u64 | 24 tensor_bytes u64 | 32 round u64 | 40 dtype u8 | 41..47 zero
inline constexpr size_t kBatchEntryBytes = 48;
inline constexpr size_t kBatchAlign = 64;
inline constexpr uint32_t kMaxBatchEntries = 4096;

struct BatchEntry {
  uint64_t key = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t tensor_bytes = 0;
  uint64_t round = 0;
  DType dtype = DType::f32;
  uint64_t at = 0;  // where the entry's bytes start in the payload (batch_layout assigns it)
};

// Assigns every entry's `at`; returns the payload size.
uint64_t batch_layout(std::span<BatchEntry> entries);
// Writes the table (not the data) into the first entries.size() * kBatchEntryBytes bytes of `out`, and zeroes the
// padding after it and after each entry's bytes. `out` is batch_layout's size, or only the table's (the first entry's
// `at`): then the table and its padding.
void encode_batch_table(std::span<const BatchEntry> entries, std::span<std::byte> out);
// A batch as pieces to send in place (OutPayload's gather list): `table` (the first entry's `at` bytes, which
// encode_batch_table fills when given just that much), then each entry's `data` with the zero padding after it, up to
// `total` (batch_layout's size).
std::vector<std::span<const std::byte>> batch_pieces(std::span<const BatchEntry> entries,
                                                     std::span<const std::byte> table,
                                                     std::span<const std::byte* const> data, uint64_t total);

struct DecodedBatch {
  std::vector<BatchEntry> entries;  // empty when `error` is set
  std::string error;
};
// Validates the table of a decoded push_pull_batch/sum_batch header `h` against its payload: every range whole
// elements inside its tensor, the layout exactly batch_layout's. Never reads outside `payload`; never throws.
DecodedBatch decode_batch(const Header& h, std::span<const std::byte> payload, const DecodeLimits& limits = {});
// The header of one entry of batch `h`: a push_pull (sum) of that range, with the batch's sender, iteration, request.
Header entry_header(const Header& h, const BatchEntry& e);

// Text payloads (errors, endpoints) are bounded so a bad peer cannot make us allocate much.
inline constexpr size_t kMaxTextPayload = 64 * 1024;

}  // namespace commsched::ps
