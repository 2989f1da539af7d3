// Raw TCP baselines for ps_goodput: the same traffic as a push_pull on a bare socket. Echo (the peer sends every
// byte back, a window in flight) is the fair baseline for push_pull; one-way (a plain stream) is what iperf3 measures.
// A socket that cannot be set up ends the run with a line naming the address (a bench has no caller to tell).
#pragma once

#include <cstdint>
#include <string>

namespace commsched::bench {

// A listening socket on addr:port.
int listen_on(const std::string& addr, int port);

// Serves connections on `lfd` one after another until the socket is shut or closed: first byte 'E' = echo everything, 'D' = discard
// then answer one byte; then the byte count as 8 bytes.
void raw_server(int lfd);

// Bytes per second echoed: `total` bytes in `part`-byte writes, at most `window_bytes` unanswered; 0 when the echo
// broke off.
double raw_echo(const std::string& addr, int port, uint64_t part, uint64_t total, uint64_t window_bytes);

// Bytes per second streamed one way: `total` bytes in `part`-byte writes, timed until the server's answer; 0 when it
// did not answer.
double raw_oneway(const std::string& addr, int port, uint64_t part, uint64_t total);

}  // namespace commsched::bench
