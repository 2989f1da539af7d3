#include "comm_backends/control/net_util.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>

namespace commsched::control {
std::string interface_address(const std::string& name) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return {};
  std::string found;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (a->ifa_addr && a->ifa_addr->sa_family == AF_INET && name == a->ifa_name) {
      char buf[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
      found = buf;
      break;
    }
  }
  freeifaddrs(list);
  return found;
}

std::string local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
    throw std::runtime_error("cannot resolve the rendezvous root COMMSCHED_ROOT_ADDR='" + host + "'");
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  std::string out;
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof local;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &local.sin_addr, buf, sizeof buf);
      out = buf;
    }
  }
  if (fd >= 0) ::close(fd);
  freeaddrinfo(res);
  if (out.empty()) throw std::runtime_error("no route to the rendezvous root " + host + ":" + std::to_string(port));
  return out;
}

// Never every interface by default: the one that faces the root (loopback for a one-host run), so a port is not
// reachable from networks the run does not use. COMMSCHED_BIND='*' asks for every interface explicitly.
std::string bind_host(const ClusterEnv& env) {
  if (!env.bind.empty()) return env.bind;
  return local_address_towards(env.root_addr, env.root_port);
}

std::string advertised_host(const ClusterEnv& env) {
  if (env.bind.empty()) return local_address_towards(env.root_addr, env.root_port);
  if (auto a = interface_address(env.bind); !a.empty()) return a;
  in_addr probe{};
  if (inet_pton(AF_INET, env.bind.c_str(), &probe) == 1) return env.bind;
  throw std::runtime_error("COMMSCHED_BIND='" + env.bind + "' is neither an IPv4 address nor an interface with one");
}

std::string address_text(const sockaddr* address) {
  if (!address || address->sa_family != AF_INET) return {};
  const auto* in = reinterpret_cast<const sockaddr_in*>(address);
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf);
  return std::string(buf) + ":" + std::to_string(ntohs(in->sin_port));
}

std::string peer_address(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (fd < 0 || getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return {};
  return address_text(reinterpret_cast<const sockaddr*>(&a));
}

}  // namespace commsched::control
