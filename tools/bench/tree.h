#pragma once
// `deltacast bench tree` (docs/benchmarks.md): the relay tree's benchmark, in the style of
// nccl-tests, for users. Launched like `deltacast run` (mpirun, srun, or --rank/--size with the
// same config, transport options and secret); rank 0 is the producer and ranks 1..N-1 receivers,
// through the real tree::Producer and tree::Receiver. Broadcast mode sweeps payload sizes per
// topology (time of the full checkpoint, i.e. Producer::bootstrap, to every receiver verified);
// refit mode times a synthetic model's full checkpoint against delta refits at given change
// rates. Rank 0 prints a table and writes --json and --svg.
#include <CLI/CLI.hpp>

namespace deltacast::tools {

// Adds the `tree` subcommand, its options and its callback to `bench` (tools/bench/bench_command.cpp).
void setup_bench_tree(CLI::App& bench);

}  // namespace deltacast::tools
