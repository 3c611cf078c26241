# Bar chart of the benchmark's ratios (bench.py writes the data file).
# gnuplot -e "datafile='x.dat'; outfile='x.png'; term='pngcairo'; subtitle='...'" chart.gnuplot
# Data: label <TAB> ratio with synchronous_commit=on <TAB> ratio with it off ("?" = not run)

if (term eq "pngcairo") {
    set terminal pngcairo size 1280,720 font "DejaVu Sans,10" noenhanced
} else {
    set terminal png size 1280,720 noenhanced
}
set output outfile

set title "Throughput relative to the same round's reference (bare transaction; 7a: plain PK SELECT; 2t, 7at: as named)\n".subtitle
set datafile separator "\t"
set datafile missing "?"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set yrange [0:*]
set ylabel "ratio (1.0 = reference)"
set xtics rotate by -30 scale 0 nomirror
set grid ytics
set key top left
set bmargin 9
set rmargin 10
set arrow 1 from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb "#444444"

plot datafile using 2:xtic(1) title "synchronous_commit = on" lc rgb "#1f77b4", \
     '' using 3 title "synchronous_commit = off" lc rgb "#ff7f0e", \
     '' using ($0 - 1.0/6):2:(sprintf("%.2f", $2)) with labels offset 0,0.6 font ",8" notitle, \
     '' using ($0 + 1.0/6):3:(sprintf("%.2f", $3)) with labels offset 0,0.6 font ",8" notitle
