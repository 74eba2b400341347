# Sourced by the benchmark scripts: the hypervisor's share of the CPU time
# (steal) between two points of a run, which on a shared VM is what makes
# runs spread.
#   before=$(cpu_ticks); ...; echo "$(steal_share "$before" "$(cpu_ticks)")%"

# cpu_ticks -> "TOTAL STEAL": the ticks of /proc/stat's cpu line (user
# through steal) and of steal alone, so far.
cpu_ticks() { awk '$1 == "cpu" { t = 0; for (i = 2; i <= 9; i++) t += $i; print t, $9 }' /proc/stat; }

# steal_share "TOTAL STEAL" "TOTAL STEAL" -> steal's percent of the ticks between.
steal_share() {
  awk -v a="$1" -v b="$2" 'BEGIN { split(a, x, " "); split(b, y, " "); t = y[1] - x[1]; printf "%.1f", t ? 100 * (y[2] - x[2]) / t : 0 }'
}
