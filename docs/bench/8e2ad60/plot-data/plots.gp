set terminal pngcairo size 1200,480 font ',10'
set grid

set output 'docs/bench/8e2ad60/io_vs_k.png'; set multiplot layout 1,2 title 'Cold cache, 2 ranks, qwen3-0.6b'
set xlabel 'experts K'; set ylabel 'expert GB read'; set key left top
plot 'docs/bench/8e2ad60/plot-data/k.dat' u 1:2 w lp t 'full read (TIES)', '' u 1:3 w lp t '10% budget (TIES)'
set ylabel 'wall time s'
plot 'docs/bench/8e2ad60/plot-data/k.dat' u 1:4 w lp t 'TIES full read', '' u 1:5 w lp t 'TIES 10%', '' u 1:6 w lp t 'linear full read', '' u 1:7 w lp t 'linear 10%'
unset multiplot

set output 'docs/bench/8e2ad60/wall_vs_budget.png'; set multiplot layout 1,2 title 'Cold cache, K=20, 2 ranks'
set xlabel 'budget % of the full expert read'; set ylabel 'wall time s'; set key left top
plot 'docs/bench/8e2ad60/plot-data/budget-linear.dat' u 1:2 w lp t 'linear', 'docs/bench/8e2ad60/plot-data/budget-ties.dat' u 1:2 w lp t 'ties', 'docs/bench/8e2ad60/plot-data/budget-dare_ties.dat' u 1:2 w lp t 'dare\_ties', 'docs/bench/8e2ad60/plot-data/budget-ties.dat' u 1:4 w l dt 2 t 'I/O lower bound (ties)'
set ylabel 'bytes moved GB'
plot 'docs/bench/8e2ad60/plot-data/budget-linear.dat' u 1:3 w lp t 'linear', 'docs/bench/8e2ad60/plot-data/budget-ties.dat' u 1:3 w lp t 'ties', 'docs/bench/8e2ad60/plot-data/budget-dare_ties.dat' u 1:3 w lp t 'dare\_ties'
unset multiplot
set output 'docs/bench/8e2ad60/frontier.png'; set title 'Speed-fidelity frontier (K=20, budgets 5-50%)'
set xlabel 'wall time s'; set ylabel 'relative L2 deviation from the full read'; set logscale y; set key right top
plot 'docs/bench/8e2ad60/plot-data/budget-linear.dat' u 2:($5>0?$5:1/0):(sprintf('%d%%',$1)) w lp t 'linear', '' u 2:($5>0?$5:1/0):(sprintf('%d%%',$1)) w labels offset 1,0.5 notitle, \
     'docs/bench/8e2ad60/plot-data/budget-ties.dat' u 2:($5>0?$5:1/0) w lp t 'ties', 'docs/bench/8e2ad60/plot-data/budget-dare_ties.dat' u 2:($5>0?$5:1/0) w lp t 'dare\_ties'
unset logscale y; unset title

set output 'docs/bench/8e2ad60/scaling.png'; set title 'Throughput (bytes moved / s) by ranks x threads'
set style data histogram; set style histogram cluster gap 1; set style fill solid 0.7; set ylabel 'GB/s'
set xtics rotate by -20; set key off; set xlabel 'merge, ranks x threads'; set yrange [0:*]
plot 'docs/bench/8e2ad60/plot-data/scaling.dat' u 3:xtic(sprintf('%s %s', stringcolumn(1), stringcolumn(2)))