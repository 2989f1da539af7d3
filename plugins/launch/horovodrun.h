// `commsched horovodrun`: Horovod's launcher command line over `commsched launch`, so that a Horovod job script
// changes only its import and the word before `horovodrun`:
//
//   commsched horovodrun -np 8 -H node1:4,node2:4 python train.py
//
// The workers are placed as horovodrun places them (hosts in the order given, each filled up to its slots until -np),
// and every host runs one `commsched launch --nnodes N --node-rank I` for its share: this host's directly, another
// host's over ssh (BatchMode: keys, no password prompts), in the same working directory, with the launching shell's
// environment (as horovodrun forwards it) and the run's secret, both written to ssh's stdin, never on a command line.
// The launchers then meet at the first host's and run the job as one (plugins/launch/launcher.h): Gloo all-reduce by
// default, as horovodrun's Gloo mode; `--servers-per-host S` runs the parameter server instead. Elastic: --min-np and
// --max-np are `launch --min-workers` and `--max-workers`, and a lost host no longer ends the run.
#pragma once

#include <CLI/CLI.hpp>

#include <map>
#include <string>
#include <vector>

namespace commsched {

struct HostSlots {
  std::string host;
  int slots = 1;
};

// "-H a:2,b:2" (a host without ":N" has one slot). Throws InvalidArgument naming the entry.
std::vector<HostSlots> parse_hosts(const std::string& text);
// A hostfile's lines, "host slots=N" (N=1 when left out; '#' starts a comment). Throws naming the file and line.
std::vector<HostSlots> parse_hostfile(const std::string& contents, const std::string& path);
// The hosts that run workers, each with its share: in order, each up to its slots, until np (shares may differ:
// each host's launcher numbers its workers after those of the hosts before it). An np above the slots is refused.
std::vector<HostSlots> place_workers(int np, const std::vector<HostSlots>& hosts);
// `s` as one word for a POSIX shell.
std::string shell_quote(const std::string& s);
// The command line ssh runs on a remote host: a POSIX shell that runs the script it reads from stdin (whatever the
// user's login shell is). Nothing of the run is on it, since any user of that host can read a command line. It reads
// one line, not up to end-of-file: stdin stays open for the run, and the launcher's --stdin-lifeline stops the host
// when it closes (ssh without a tty forwards no Ctrl-C, but closes the remote stdin when it ends).
inline constexpr const char* kRemoteShell = "/bin/sh -c 'IFS= read -r script && eval \"$script\"'";
// The script written to ssh's stdin, one line: export `env` (the secret among it), enter `cwd`, exec `argv`.
std::string remote_script(const std::string& cwd, const std::map<std::string, std::string>& env,
                          const std::vector<std::string>& argv);
// The launching shell's environment as remote hosts get it: all of it but what describes this host or session
// (HOSTNAME, PWD, SSH_*, ...) and the secret (sent on stdin). `environ`-style, null-terminated.
std::map<std::string, std::string> forwarded_env(char** envp);

void add_horovodrun_subcommand(CLI::App& app);

}  // namespace commsched
