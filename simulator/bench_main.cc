// Standalone `commsched-sim bench ...`: the same subcommand the commsched executable carries, for runs without it.
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "simulator/bench_cli.h"
#include "simulator/huge_pages.h"
#include "base/types.h"

int main(int argc, char** argv) {
  commsched::restart_with_huge_pages(argv);  // the simulation's heap on huge pages (see huge_pages.h)
  CLI::App app{"commsched simulator benchmarks"};
  app.require_subcommand(1);
  commsched::add_bench_subcommand(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::cerr << "commsched-sim: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
