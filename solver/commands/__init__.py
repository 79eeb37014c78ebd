"""One module per `mapsat` subcommand; each defines a click command named `command`."""
