// Gradient codecs: pure functions from a partition's elements to the bytes that go on the wire and back.
// No threads, no state beyond what the caller passes (the error-feedback residual), no engine or backend types, so
// the engine's compression stage, the parameter server and the simulator's byte model all use the very same code.
//
// Schemes:
//   fp16 / bf16  cast every element; the sum is defined on the wire (a collective or a PS sums the cast values).
//   topk:R       the ceil(R*n) elements of largest magnitude of (gradient + residual), as (u32 index, value) pairs;
//                what is not sent stays in the residual (error feedback). Wire: [k x u32 index][k x value].
//   signsgd      one bit per element (the sign of gradient + residual) and one f32 scale, mean |gradient + residual|;
//                the residual keeps the difference (error feedback, as in EF-signSGD). Wire: [f32 scale][u32 words].
// Only floating-point dtypes are compressed; values keep their dtype on the wire (so f64 stays exact in top-k).
// A parameter server sums top-k and signSGD pushes with decode_add and answers with encode_sum (same scheme, same
// size; wire_spec recovers the Spec from a message's size), see comm_backends/ps/slot_table.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "scheduler/types.h"

namespace commsched::compression {

enum class Scheme : uint8_t { none = 0, fp16 = 1, bf16 = 2, topk = 3, signsgd = 4 };
inline constexpr uint8_t kMaxScheme = 4;

struct Spec {
  Scheme scheme = Scheme::none;
  double ratio = 0.01;  // topk: the share of elements sent, in (0, 1]
  bool operator==(const Spec&) const = default;
};

std::string_view scheme_name(Scheme s);
// "none", "fp16", "bf16", "topk" (ratio 0.01), "topk:0.05", "signsgd"; throws InvalidArgument naming var and value.
Spec parse_spec(std::string_view var, std::string_view value);
// The text parse_spec reads back ("topk:0.01").
std::string to_string(const Spec& s);

// Whether a sum of encoded partitions is itself an encoded partition (casts): then any all-reduce can carry it.
inline bool sums_on_wire(Scheme s) { return s == Scheme::fp16 || s == Scheme::bf16; }
// Whether tensors of this dtype are compressed at all (integers never are).
bool compressible(DType d);
// The type the residual of a `d` tensor is kept in: f64 for f64, else f32.
DType residual_dtype(DType d);

// Elements top-k keeps of n: ceil(ratio * n), at least 1 when n > 0, at most n.
uint64_t topk_count(double ratio, uint64_t n);
// Bytes on the wire for n elements of d under s (n * size of d for none).
uint64_t encoded_bytes(const Spec& s, DType d, uint64_t n);

// Encodes n elements at `in` (dtype d) into `out` (encoded_bytes(s, d, n) bytes). `residual` (n elements of
// residual_dtype(d), or null for no error feedback) is added before encoding and left holding what was not sent,
// so residual_after + decode(out) == in + residual_before.
void encode(const Spec& s, DType d, const void* in, uint64_t n, void* residual, std::byte* out);
// Decodes `wire` (encoded_bytes(s, d, n) bytes) into n elements of dtype d at `out` (overwritten).
void decode(const Spec& s, DType d, const std::byte* wire, uint64_t n, void* out);
// Adds the decoded `wire` into n elements of dtype `acc_dtype` at `acc` (a parameter server's sum); acc_dtype is
// residual_dtype(d).
void decode_add(const Spec& s, DType d, const std::byte* wire, uint64_t n, void* acc);

// Encodes n accumulated values at `acc` (residual_dtype(d), as decode_add leaves them) into the wire format of a `d`
// tensor: a parameter server answering with the encoded sum. topk and signsgd only; `residual` as in encode (the
// server's own error feedback, or null).
void encode_sum(const Spec& s, DType d, const void* acc, uint64_t n, void* residual, std::byte* out);
// The Spec that a `scheme` message of `wire_bytes` for n elements of d was encoded with (top-k: k from the size),
// so a receiver that was told only the scheme decodes it and answers in the same size. Returns "" and sets `out`,
// or a description of why the size is impossible (malformed or mismatched).
std::string wire_spec(Scheme scheme, DType d, uint64_t n, uint64_t wire_bytes, Spec& out);

}  // namespace commsched::compression
