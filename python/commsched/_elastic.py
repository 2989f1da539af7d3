"""Elastic membership: which workers form the job now, agreed through a store that outlives every worker.

The framework-neutral half of Horovod's elastic API (commsched.torch.elastic holds the states and the decorator).
An elastic job has a membership store (COMMSCHED_ELASTIC_STORE: `commsched launch --min-workers N` serves it) and
goes through *generations*: the launcher's ranks are generation 0; when a worker is lost, the survivors form
generation g+1 over the store, and a worker started later (a joiner) is let in at the survivors' next commit. Each
generation gets new ranks 0..n-1, a new rendezvous root (its rank 0) and COMMSCHED_GENERATION=g, which is part of
every rendezvous key, so nothing of an earlier generation is ever read again. With parameter servers, the launcher
starts each generation's servers once the generation is published (it reads "gen/G/size" and "gen/G/port").

Forming generation g+1 (store keys under PREFIX):
- every survivor takes a number with add("gen/G/count", 1) and registers under "gen/G/reg/NUMBER";
- the first to register decides: it waits until every member of generation g has registered or is known lost
  ("lost/ID": the launcher reaped that worker process; "claimed/UID": a survivor's error named it), at most
  COMMSCHED_TIMEOUT (a frozen worker is then left out), adds the waiting joiners up to COMMSCHED_MAX_WORKERS, and
  publishes "gen/G/members" with itself as rank 0 (it holds the last commit, as every survivor does); below
  COMMSCHED_MIN_WORKERS it publishes the reason instead and every process raises it;
- a process left out (it was frozen, or came back too late) joins again as a joiner.
The decider's own loss while deciding is not survived: the others give up after waiting twice COMMSCHED_TIMEOUT with
an error that says so.
"""
import json
import os
import re
import socket
import sys
import time

from commsched import _C

PREFIX = "commsched/elastic/"      # plugins/launch/elastic_store.h: kElasticPrefix
_POLL_S = 0.02
_ENV_OF_GENERATION = ("COMMSCHED_RANK", "COMMSCHED_NUM_WORKERS", "COMMSCHED_LOCAL_RANK", "COMMSCHED_LOCAL_SIZE",
                      "COMMSCHED_ROOT_ADDR", "COMMSCHED_ROOT_PORT", "COMMSCHED_GENERATION")


class ElasticError(RuntimeError):
    """The elastic job cannot go on: fewer workers than COMMSCHED_MIN_WORKERS remain, or the membership could not be
    agreed. Every process of the job raises it with the same message."""


def _parse_address(text):
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"COMMSCHED_ELASTIC_STORE='{text}': expected HOST:PORT")
    return host, int(port)


def _free_port(host):
    """A port to serve the next generation's rendezvous on (the control plane's rule: below the kernel's ephemeral
    range, where Gloo's own listeners, bound to port 0, never land)."""
    try:
        return _C.free_port(host)
    except RuntimeError as e:
        raise ElasticError(f"elastic: no free port on {host} for the next generation's rendezvous ({e})") from None


_LOST_RANK = re.compile(r"\brank (\d+) lost\b")


def lost_rank(message):
    """The rank a peer-loss error names ('rank 3 lost: ...', as the negotiation reports it), or None."""
    m = _LOST_RANK.search(message)
    return int(m.group(1)) if m else None


class Membership:
    """This process's view of the elastic job: its id, the current generation and its members (ids by rank)."""

    def __init__(self, env):
        host, port = _parse_address(env["elastic_store"])
        self.timeout_s = float(env["timeout_s"])
        self.store = _C.StoreClient(host, port, max(30.0, 3 * self.timeout_s))
        self.min_workers = int(env["min_workers"])
        self.max_workers = int(env["max_workers"])
        self.uid = os.environ.get("COMMSCHED_ELASTIC_ID") or f"{socket.gethostname()}:{os.getpid()}"
        # Where the others reach this process (as its data sockets are advertised), not its host name: two hosts may
        # share a name (network namespaces, containers) or have one that does not resolve elsewhere. It also tells
        # which members share a host (their local ranks).
        self.host = _C.advertised_host()
        self.generation = None
        self.members = []      # [{"uid", "host"}] in rank order
        self.joins_seen = 0    # join requests let in up to the current generation

    # ---- store helpers ----
    def _key(self, *parts):
        return PREFIX + "/".join(str(p) for p in parts)

    def _get_json(self, *parts):
        return json.loads(self.store.get(self._key(*parts), self.timeout_s).decode())

    def _try_json(self, *parts):
        key = self._key(*parts)
        return json.loads(self.store.get(key, 1.0).decode()) if self.store.contains(key) else None

    def _check_abort(self):
        if self.store.contains(self._key("abort")):
            raise ElasticError("elastic: " + self.store.get(self._key("abort"), 1.0).decode())

    def _me(self):
        return {"uid": self.uid, "host": self.host}

    # ---- generation 0 ----
    def start(self, env):
        """At init(): the launcher's ranks form the first generation; a joiner (COMMSCHED_ELASTIC_JOIN=1) waits to be
        let in. Sets this process's COMMSCHED_* contract for the Context it is about to create."""
        if os.environ.get("COMMSCHED_ELASTIC_JOIN") == "1":
            return self.join()
        g, rank, n = int(env["generation"]), int(env["rank"]), int(env["num_workers"])
        self.store.set(self._key("gen", g, "rank", rank), json.dumps(self._me()).encode())
        self.members = [self._get_json("gen", g, "rank", r) for r in range(n)]
        self.generation = g
        if rank == 0 and not self.store.contains(self._key("current")):
            record = {"members": self.members, "joins": 0, "root": [env["root_addr"], env["root_port"]]}
            self.store.set(self._key("gen", g, "members"), json.dumps(record).encode())
            self.store.set(self._key("current"), str(g).encode())
        return rank

    # ---- forming the next generation ----
    def mark_lost(self, rank):
        """This process's error named `rank` of the current generation as lost."""
        if rank is not None and 0 <= rank < len(self.members) and self.members[rank]["uid"] != self.uid:
            self.store.set(self._key("claimed", self.members[rank]["uid"]), b"1")

    def reform(self):
        """After a failure or a host update: forms the next generation with the others; returns the new rank."""
        self._check_abort()
        nxt = self.generation + 1
        if self._current() >= nxt:
            return self.join()  # the others formed it without this process (it was frozen or late)
        number = self.store.add(self._key("gen", nxt, "count"), 1)
        self.store.set(self._key("gen", nxt, "reg", number), json.dumps(self._me()).encode())
        if number == 1:
            self._decide(nxt)
        return self._await(nxt, 2 * self.timeout_s + 10)

    def _registered(self, g):
        count = self.store.add(self._key("gen", g, "count"), 0)
        return [self._get_json("gen", g, "reg", i) for i in range(1, count + 1)]

    def _is_lost(self, uid):
        """The launcher reaped its process (keyed by the launcher's id, the uid's part before '.'), or a survivor
        named it lost in this membership (a process let in again gets a new uid, so an old claim does not stick)."""
        return (self.store.contains(self._key("lost", uid.split(".")[0]))
                or self.store.contains(self._key("claimed", uid)))

    def _current(self):
        key = self._key("current")
        return int(self.store.get(key, 1.0).decode()) if self.store.contains(key) else -1

    def _decide(self, g):
        deadline = time.monotonic() + self.timeout_s
        while True:
            registered = {m["uid"]: m for m in self._registered(g)}
            waiting = [m["uid"] for m in self.members if m["uid"] not in registered and not self._is_lost(m["uid"])]
            if not waiting or time.monotonic() > deadline:
                break
            time.sleep(_POLL_S)
        survivors = [registered[self.uid]] + [registered[m["uid"]] for m in self.members
                                              if m["uid"] in registered and m["uid"] != self.uid]
        members, joins = self._admit_joiners(survivors)
        if len(members) < self.min_workers:
            record = {"abort": f"fewer workers than the minimum remain ({len(members)} < {self.min_workers}, "
                               f"COMMSCHED_MIN_WORKERS) after generation {g - 1} lost "
                               f"{len(self.members) - len(survivors)} worker(s)"}
            self.store.set(self._key("abort"), record["abort"].encode())
        else:
            record = {"members": members, "joins": joins,
                      "root": [self.host, _free_port("127.0.0.1" if self.host == "127.0.0.1" else "0.0.0.0")]}
        self.store.set(self._key("gen", g, "members"), json.dumps(record).encode())
        if "members" in record:  # for the launcher, which starts the generation's parameter servers
            self.store.set(self._key("gen", g, "size"), str(len(members)).encode())
            self.store.set(self._key("gen", g, "port"), str(record["root"][1]).encode())
        self.store.set(self._key("current"), str(g).encode())

    def _admit_joiners(self, members):
        members = list(members)
        total, seen = self.store.add(self._key("joins"), 0), self.joins_seen
        while seen < total and (self.max_workers <= 0 or len(members) < self.max_workers):
            seen += 1
            joiner = self._get_json("join", seen)
            if not self._is_lost(joiner["uid"]):
                members.append(joiner)
        return members, seen

    def pending_joiners(self):
        """How many joiners wait for a place (checked at a commit by rank 0)."""
        waiting = self.store.add(self._key("joins"), 0) - self.joins_seen
        room = self.max_workers - len(self.members) if self.max_workers > 0 else waiting
        return max(0, min(waiting, room))

    def _await(self, g, limit_s):
        deadline = time.monotonic() + limit_s
        while not self.store.contains(self._key("gen", g, "members")):
            self._check_abort()
            if time.monotonic() > deadline:
                raise ElasticError(f"elastic: the membership of generation {g} was not decided within {limit_s:.0f} s "
                                   "(the process deciding it was lost meanwhile); the job cannot continue")
            time.sleep(_POLL_S)
        return self._adopt(g, self._get_json("gen", g, "members"))

    def _adopt(self, g, record):
        if "abort" in record:
            raise ElasticError("elastic: " + record["abort"])
        uids = [m["uid"] for m in record["members"]]
        if self.uid not in uids:
            self.generation = g
            return self.join()
        self.generation, self.members, self.joins_seen = g, record["members"], record["joins"]
        self._set_contract(uids.index(self.uid), record["root"])
        return uids.index(self.uid)

    def _set_contract(self, rank, root):
        hosts = [m["host"] for m in self.members]
        here = [r for r, h in enumerate(hosts) if h == hosts[rank]]
        os.environ.update({
            "COMMSCHED_RANK": str(rank), "COMMSCHED_NUM_WORKERS": str(len(self.members)),
            "COMMSCHED_LOCAL_RANK": str(here.index(rank)), "COMMSCHED_LOCAL_SIZE": str(len(here)),
            "COMMSCHED_ROOT_ADDR": root[0], "COMMSCHED_ROOT_PORT": str(root[1]),
            "COMMSCHED_GENERATION": str(self.generation)})

    # ---- joiners ----
    def join(self):
        """Asks to be let in and waits (no time limit: the survivors let joiners in at their next commit) until a
        generation includes this process. When the job ends first, the process exits with status 0 (it was not
        needed), saying so."""
        number = self.store.add(self._key("joins"), 1)
        self.uid = f"{self.uid.split('.')[0]}.j{number}"
        self.store.set(self._key("join", number), json.dumps(self._me()).encode())
        seen = self.generation if self.generation is not None else -1
        while True:
            self._check_abort()
            if self.store.contains(self._key("finished")):
                print(f"[commsched] elastic: the job finished before worker {self.uid} could join it",
                      file=sys.stderr, flush=True)
                raise SystemExit(0)
            current = self._current()
            if current > seen:
                seen = current
                record = self._get_json("gen", current, "members")
                if "abort" in record:
                    raise ElasticError("elastic: " + record["abort"])
                if self.uid in [m["uid"] for m in record["members"]]:
                    return self._adopt(current, record)
            time.sleep(5 * _POLL_S)

    def finish(self):
        """The training function returned: joiners still waiting give up."""
        self.store.set(self._key("finished"), b"1")


_membership = None


def membership():
    """This process's Membership when the job is elastic (COMMSCHED_ELASTIC_STORE set), else None."""
    return _membership


def start():
    """Called by init() before the Context is made: joins the elastic job when there is one (a no-op otherwise)."""
    global _membership
    env = _C.cluster_env()  # the option registry's reading of the environment (COMMSCHED_ELASTIC_STORE among it)
    if not env["elastic_store"]:
        return
    if _membership is None:
        _membership = Membership(env)
        _membership.start(env)
