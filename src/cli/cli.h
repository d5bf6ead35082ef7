/* cli/cli.h — one entry point per `moetrain <command>` (one file each, no logic of their own
 * beyond wiring flags to the library). Each returns the process exit code. */
#ifndef MT_CLI_CLI_H
#define MT_CLI_CLI_H

int mt_cmd_data(int argc, char **argv);
int mt_cmd_train(int argc, char **argv);
int mt_cmd_eval(int argc, char **argv);
int mt_cmd_generate(int argc, char **argv);
int mt_cmd_info(int argc, char **argv);
int mt_cmd_bench(int argc, char **argv);
int mt_cmd_dump(int argc, char **argv);
int mt_cmd_export(int argc, char **argv);
int mt_cmd_plan(int argc, char **argv);
int mt_cmd_rl(int argc, char **argv);

/* prints "moetrain: error: <mt_last_error()>" and returns 1 */
int mt_cli_fail(void);
/* Checks --comm-timeout (finite, >= 0) and hands it to the watchdog (parallel/dist.h). */
int mt_cli_comm_timeout(const char *cmd, double seconds);

#endif
