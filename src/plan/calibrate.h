/* plan/calibrate.h — `moetrain bench --calibrate OUT.json`: measure this machine and write
 * a cluster file (plan/cluster.h format) that `moetrain plan --cluster OUT.json` reads.
 *
 * Measured: SGEMM GFLOP/s on a grid of training shapes (fp32 peak = the best one; the
 * efficiency curve = rate / peak, binned by FLOPs per call), causal attention fwd + bwd at
 * T = 512 and 4096, element-wise bandwidth (copy = memory_bw_gbs, AdamW / copy =
 * efficiency.memory), memory from /proc/meminfo. Under mpirun (MPI initialised by the
 * caller, world size > 1): every rank measures at once (figures = the minimum over ranks),
 * then ping-pong latency / bandwidth to a rank on the same node (and on another node if
 * any) and an MPI_Alltoall over the world. Anything not measured is listed in "assumed". */
#ifndef MT_PLAN_CALIBRATE_H
#define MT_PLAN_CALIBRATE_H

/* Runs the measurements (collective when MPI is initialised with several ranks) and
 * writes `path` on rank 0. quick: shorter timings and smaller buffers (< 10 s), no
 * T = 4096 attention. Returns 0, or -1 with a message. */
int mt_calibrate(const char *path, int quick);

#endif
