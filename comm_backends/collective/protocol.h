// The order negotiation's wire messages (rank <-> rank 0). Their vocabulary (reports, orders, errors) is the global
// order's, scheduler/global_order.h; this file only puts it on the wire.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/types.h"
#include "scheduler/global_order.h"

namespace commsched::collective {

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
  mark = 13,      // rank -> coordinator: its end of backward or flush (IterationMark: uint8 backward, uint64 after)
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
std::string encode_mark(const IterationMark& m);

class ByteReader;
MsgType read_type(ByteReader& r);
std::vector<ReadyReport> decode_ready(ByteReader& r);
OrderMsg decode_order(ByteReader& r);
ErrorMsg decode_error(ByteReader& r);
IterationMark decode_mark(ByteReader& r);

}  // namespace commsched::collective
