// Development driver for the launcher until plugins/cli wires the subcommands into `commsched`.
#include <CLI/CLI.hpp>

#include "plugins/launch/launch_cli.h"

int main(int argc, char** argv) {
  CLI::App app{"commsched parameter-server launcher (development build)"};
  app.require_subcommand(1);
  commsched::add_launch_subcommand(app);
  commsched::add_server_subcommand(app);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
