// Address helpers for rendezvous: which address this process binds to and advertises to its peers.
#pragma once

#include <string>

#include "comm_backends/cluster_env.h"

namespace commsched::ps {

// Host part to bind data sockets to: COMMSCHED_BIND (address or interface name, ZeroMQ accepts both; '*' for every
// interface) or else the local address of the route towards the root (127.0.0.1 when the root is on loopback).
std::string bind_host(const ClusterEnv& env);
// Address other processes use to reach us: COMMSCHED_BIND's address (an interface name is resolved to its IPv4
// address) or else the local address of the route towards the root. Throws std::runtime_error naming the culprit.
std::string advertised_host(const ClusterEnv& env);
// IPv4 address of the interface `name` ("" when there is none).
std::string interface_address(const std::string& name);

}  // namespace commsched::ps
