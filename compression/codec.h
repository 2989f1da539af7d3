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
#include <span>
#include <string>
#include <string_view>

#include "base/types.h"

namespace commsched::compression {

// A codec's id on the wire (PS message headers carry it): never renumber. Each has one row in the codec registry.
enum class Scheme : uint8_t { none = 0, fp16 = 1, bf16 = 2, topk = 3, signsgd = 4 };

struct Spec {
  Scheme scheme = Scheme::none;
  double ratio = 0.01;  // topk: the share of elements sent, in (0, 1]
  bool operator==(const Spec&) const = default;
};

// What a reduction can do with a codec's messages.
enum class Summing {
  dense,           // none: the elements themselves
  on_wire,         // casts: a sum of encoded partitions is itself one, so any all-reduce can carry it
  server_decodes,  // a parameter server decodes each push (decode_add), sums and answers encoded (encode_sum)
};

// The codec registry: one row per codec, the only place that lists them. Adding a codec is a Scheme value, a row
// (codec.cc kCodecs) and its own encode/decode functions; the engine's compression stage, the parameter server, its
// protocol checks, the option parser and the simulator's byte and time model read the rows.
struct Codec {
  Scheme scheme;
  std::string_view name;                      // canonical (scheme_name, to_string)
  std::span<const std::string_view> aliases = {};  // also accepted by parse_spec
  bool takes_ratio = false;                   // NAME:RATIO (RATIO in (0, 1]) sets Spec::ratio
  Summing summing = Summing::dense;
  DType wire_dtype = DType::f32;              // on_wire: the narrow dtype an encoded partition is carried as
  bool server_residual = false;               // server_decodes: the server keeps error feedback for its answers
  // Bytes on the wire for n elements of d.
  uint64_t (*wire_bytes)(const Spec&, DType d, uint64_t n);
  void (*encode)(const Spec&, DType d, const void* in, uint64_t n, void* residual, std::byte* out);
  void (*decode)(const Spec&, DType d, const std::byte* wire, uint64_t n, void* out);
  // server_decodes only (null otherwise): adds a message into a sum; encodes a sum; the Spec of a message of
  // `wire_bytes` (ratio from the size), "" or why the size is impossible.
  void (*decode_add)(const Spec&, DType d, const std::byte* wire, uint64_t n, void* acc) = nullptr;
  void (*encode_sum)(const Spec&, DType d, const void* acc, uint64_t n, void* residual, std::byte* out) = nullptr;
  std::string (*size_spec)(DType d, uint64_t n, uint64_t wire_bytes, Spec& out) = nullptr;
  // The simulator's time model: encode (with error feedback where the codec keeps it) and decode, seconds per MiB of
  // f32 gradient on one core, as stage_micro_bench measures (bench/RESULTS.md).
  double encode_s_per_mib = 0, decode_s_per_mib = 0;
};

std::span<const Codec> codecs();
// What a row lacks, or "" when it is complete: a name, wire_bytes, encode and decode; decode_add, encode_sum and
// size_spec exactly when a server decodes it; a floating-point wire dtype when summed on the wire; measured stage
// costs for any codec that compresses.
std::string codec_row_gap(const Codec& c);
// The row of a scheme; throws InvalidArgument for a value no row has.
const Codec& codec(Scheme s);
// Whether `v` is a registered scheme's wire id (decoders of untrusted input).
bool is_registered(uint8_t v);

std::string_view scheme_name(Scheme s);
// "none", "fp16", "bf16", "topk" (ratio 0.01), "topk:0.05", "signsgd" and the rows' aliases; throws InvalidArgument
// naming var, the value and what is allowed (specs_allowed).
Spec parse_spec(std::string_view var, std::string_view value);
std::string specs_allowed();
// The text parse_spec reads back ("topk:0.01").
std::string to_string(const Spec& s);

// Whether a sum of encoded partitions is itself an encoded partition (casts): then any all-reduce can carry it.
inline bool sums_on_wire(Scheme s) { return codec(s).summing == Summing::on_wire; }
// Whether a parameter server decodes, sums and re-encodes this scheme's messages.
inline bool server_decodes(Scheme s) { return codec(s).summing == Summing::server_decodes; }
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
