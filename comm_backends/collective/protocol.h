// The order negotiation's vocabulary and wire messages (rank <-> coordinator on rank 0).
//
// A partition is identified across ranks by (task key, offset) plus the task's round; everything else about it
// (bytes, dtype, op, root, task size) must agree on every rank. After a partition has been ordered once, the
// coordinator gives it a small cache id, and ranks report it by id (16 bytes instead of ~60 plus the name).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/types.h"

namespace commsched::collective {

inline constexpr uint32_t kNoCacheId = 0xffffffffu;

// What every rank must agree on for one partition.
struct PartitionDesc {
  uint64_t key = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint64_t task_bytes = 0;
  DType dtype = DType::f32;
  Op op = Op::allreduce;
  int32_t root = 0;

  bool operator==(const PartitionDesc&) const = default;
  // "f32 bytes [0, 400) of a 400-byte allreduce" — for error messages.
  std::string describe() const;
};

// Where a partition sits, independent of round: the key of maps that match reports across ranks and rounds.
struct PartitionSlot {
  uint64_t key;
  uint64_t offset;
  bool operator==(const PartitionSlot&) const = default;
};
struct PartitionSlotHash {
  size_t operator()(const PartitionSlot& s) const { return s.key * 0x9e3779b97f4a7c15ull ^ s.offset; }
};

// One partition a rank reports ready. Either cache_id is set, or desc and name are.
struct ReadyReport {
  uint32_t cache_id = kNoCacheId;
  PartitionDesc desc;
  std::string name;
  uint64_t round = 0;
  int32_t priority = 0;
};

struct OrderEntry {
  uint32_t cache_id = 0;
  uint64_t round = 0;
};

// Newly assigned cache ids, then groups to execute in this order; each group is one (possibly fused) collective.
struct CacheDefine {
  uint32_t cache_id = 0;
  PartitionDesc desc;
};
struct OrderMsg {
  std::vector<CacheDefine> defines;
  std::vector<std::vector<OrderEntry>> groups;
  bool empty() const { return defines.empty() && groups.empty(); }
};

// A partition that can never run (mismatch, a rank left); every rank holding it fails it.
struct ErrorMsg {
  uint64_t key = 0;
  uint64_t offset = 0;
  uint64_t round = 0;
  Status::Code code = Status::Code::error;
  std::string message;
};

enum class MsgType : uint8_t {
  hello = 1,      // rank -> coordinator: rank, size
  welcome = 2,    // coordinator -> rank: every rank has joined
  ready = 3,      // rank -> coordinator: ReadyReports
  order = 4,      // coordinator -> ranks: OrderMsg
  error = 5,      // coordinator -> ranks: ErrorMsg
  peer_lost = 6,  // either way: a rank died or failed (int32 culprit or -1, the message naming it); everything fails
  heartbeat = 7,  // both ways when idle
  bye = 8,        // rank -> coordinator: shutting down
  all_bye = 9,    // coordinator -> ranks: every rank has said bye; close
  join = 10,      // rank -> coordinator: this rank has no more data (Horovod's join); it stands in with zeros
  joined = 11,    // coordinator -> ranks: every rank has joined; int32 the rank that joined last
  lags = 12,      // coordinator -> ranks, each heartbeat while a rank lags (once more when none does): string, the
                  // laggards as comm_backends/straggler.h writes them
};

// Encoders return a complete frame (length-prefixed). Decoders take a frame's payload after the type byte was read
// and throw std::runtime_error on malformed input.
std::string encode_hello(int rank, int size);
std::string encode_simple(MsgType t);
std::string encode_ready(const std::vector<ReadyReport>& reports);
std::string encode_order(const OrderMsg& m);
std::string encode_error(const ErrorMsg& e);
std::string encode_peer_lost(int rank, const std::string& message);
std::string encode_joined(int last_rank);
std::string encode_lags(const std::string& text);

class ByteReader;
MsgType read_type(ByteReader& r);
std::vector<ReadyReport> decode_ready(ByteReader& r);
OrderMsg decode_order(ByteReader& r);
ErrorMsg decode_error(ByteReader& r);

}  // namespace commsched::collective
