#include "base/types.h"

#include <algorithm>
#include <cctype>
#include <string>

namespace commsched {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
  }
  throw InvalidArgument("unknown dtype value " + std::to_string(static_cast<int>(t)));
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "invalid";
}

bool is_valid_dtype(uint8_t v) { return v < kNumDTypes; }

namespace {
std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}
}  // namespace

DType parse_dtype(std::string_view s) {
  const std::string v = lower(s);
  if (v == "f32" || v == "float32" || v == "float" || v == "fp32") return DType::f32;
  if (v == "f64" || v == "float64" || v == "double" || v == "fp64") return DType::f64;
  if (v == "f16" || v == "float16" || v == "half" || v == "fp16") return DType::f16;
  if (v == "bf16" || v == "bfloat16") return DType::bf16;
  if (v == "i32" || v == "int32" || v == "int") return DType::i32;
  if (v == "i64" || v == "int64" || v == "long") return DType::i64;
  throw InvalidArgument("unknown dtype '" + std::string(s) + "' (allowed: f32, f64, f16, bf16, i32, i64)");
}

std::string_view op_name(Op op) {
  switch (op) {
    case Op::push_pull: return "push_pull";
    case Op::allreduce: return "allreduce";
    case Op::broadcast: return "broadcast";
  }
  return "invalid";
}

Op parse_op(std::string_view s) {
  const std::string v = lower(s);
  if (v == "push_pull" || v == "pushpull") return Op::push_pull;
  if (v == "allreduce") return Op::allreduce;
  if (v == "broadcast") return Op::broadcast;
  throw InvalidArgument("unknown operation '" + std::string(s) + "' (allowed: push_pull, allreduce, broadcast)");
}

}  // namespace commsched
