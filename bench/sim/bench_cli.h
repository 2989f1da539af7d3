// `commsched bench`: runs the comparison grid and writes CSV, JSON, Markdown and timeline data (plots via bench/plot.py).
#pragma once

namespace CLI {
class App;
}

namespace commsched {

// Adds the `bench` subcommand to `app`; its callback runs the grid when the subcommand is given.
void add_bench_subcommand(CLI::App& app);

}  // namespace commsched
