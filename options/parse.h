// Value parsers shared by every layer's options (the option registry, options/option_table.h, and anyone parsing a
// flag). Each parser names the variable, the value and what is allowed when it rejects input.
//
// On base/ only (cmake/layering.cmake). It throws commsched::InvalidArgument (base/types.h), as compression/ does.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/types.h"

namespace commsched {

// Sizes: "4MiB", "512KiB", "1.5MB", "4096", "4k". Binary (KiB) and decimal (KB) units; bare numbers are bytes.
// When allow_unlimited, "inf", "unlimited" and "none" give 0 (meaning no limit). Zero and negative sizes are rejected.
uint64_t parse_bytes(std::string_view var, std::string_view value, bool allow_unlimited = false);
// Link rates in bits per second: "10Gbit", "1gbps", "100Mbit", "25G"; "inf"/"0" = unlimited (0) when allowed.
double parse_rate_bps(std::string_view var, std::string_view value, bool allow_unlimited = false);
// Durations in seconds: "5us", "1.5ms", "2s", "250ns"; a bare number is seconds.
double parse_seconds(std::string_view var, std::string_view value);
int64_t parse_int(std::string_view var, std::string_view value, int64_t min, int64_t max);
double parse_double(std::string_view var, std::string_view value, double min, double max);
bool parse_bool(std::string_view var, std::string_view value);

// What each parser accepts, in the words its errors use (documentation and CLI help show the same text).
std::string bytes_allowed(bool allow_unlimited);
std::string rate_allowed(bool allow_unlimited);
std::string seconds_allowed();
std::string int_allowed(int64_t min, int64_t max);
std::string double_allowed(double min, double max);
std::string bool_allowed();

// Human-readable values for logs, tables and generated documentation; each parses back with its parser.
std::string format_bytes(uint64_t bytes);    // "4 MiB"
std::string format_rate(double bps);         // "10Gbit"
std::string format_seconds(double seconds);  // "5ms"
std::string format_number(double v);         // "0.25"

// Throws InvalidArgument "VAR='value' is invalid: allowed".
[[noreturn]] void reject_value(std::string_view var, std::string_view value, std::string_view allowed);

// Reads an environment variable; nullopt when unset or empty.
std::optional<std::string> env_value(const std::string& name);

}  // namespace commsched
