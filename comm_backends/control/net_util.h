// Address helpers for rendezvous: which address this process binds to and advertises to its peers. One copy for
// every control loop (the PS server and worker, the collective negotiation, Gloo's transport address).
#pragma once

#include <string>

#include "comm_backends/cluster_env.h"

struct sockaddr;

namespace commsched::control {

// Host part to bind data sockets to: COMMSCHED_BIND (address or interface name, ZeroMQ accepts both; '*' for every
// interface) or else the local address of the route towards the root (127.0.0.1 when the root is on loopback).
std::string bind_host(const ClusterEnv& env);
// Address other processes use to reach us: COMMSCHED_BIND's address (an interface name is resolved to its IPv4
// address) or else the local address of the route towards the root. Throws std::runtime_error naming the culprit.
std::string advertised_host(const ClusterEnv& env);
// IPv4 address of the interface `name` ("" when there is none).
std::string interface_address(const std::string& name);
// The local address the kernel would use to reach host:port (a UDP "connect" picks the route and sends nothing).
// Throws std::runtime_error naming host:port when it cannot be resolved or has no route (callers pass the root).
std::string local_address_towards(const std::string& host, int port);
// "ip:port" of an IPv4 socket address ("" for any other family or none): how a peer is named in messages.
std::string address_text(const sockaddr* address);
// "ip:port" of the other end of the connected socket `fd` ("" when it has none).
std::string peer_address(int fd);

}  // namespace commsched::control
