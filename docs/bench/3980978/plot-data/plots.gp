set terminal pngcairo size 1200,480 font ',10'
set grid

set output 'docs/bench/3980978/io_vs_k.png'; set multiplot layout 1,2 title 'Cold cache, 2 ranks, qwen3-0.6b'
set xlabel 'experts K'; set ylabel 'expert GB read'; set key left top
plot 'docs/bench/3980978/plot-data/k.dat' u 1:2 w lp t 'full read (TIES)', '' u 1:3 w lp t '10% budget (TIES)'
set ylabel 'wall time s'
plot 'docs/bench/3980978/plot-data/k.dat' u 1:4 w lp t 'TIES full read', '' u 1:5 w lp t 'TIES 10%', '' u 1:6 w lp t 'linear full read', '' u 1:7 w lp t 'linear 10%'
unset multiplot