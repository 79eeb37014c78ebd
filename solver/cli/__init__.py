"""The `mapsat` command line (`app`), one module per command, and the options they share
(`options`)."""
