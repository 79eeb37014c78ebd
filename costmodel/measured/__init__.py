"""Measured training runs: their schema (runs), the files they come in (run_files,
run_bridge), each as this tool's inputs (run_mapping), predicted against measured
(run_scoring, run_report), and the Selene measurements (validation)."""
