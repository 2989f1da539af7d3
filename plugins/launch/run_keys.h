// Keys for one `commsched launch` run: every process of the run gets the same fresh shared secret (from which the
// transports derive their CURVE and HMAC keys), so no process outside the run can join it, even on loopback.
#pragma once

#include <map>
#include <string>

namespace commsched {

// Environment to add to every process of a run: COMMSCHED_SECRET with a fresh random secret, unless the caller's
// environment already configures one (COMMSCHED_SECRET or COMMSCHED_KEY_FILE: a multi-node run, where every host must
// share it) or turns authentication off (COMMSCHED_AUTH=off); then nothing, and the children inherit the caller's.
std::map<std::string, std::string> run_auth_env();

}  // namespace commsched
