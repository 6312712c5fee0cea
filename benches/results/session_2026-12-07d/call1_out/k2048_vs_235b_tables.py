# The tables of DIR (a tune's output) against the shipped tables of the same (E, N) (the file
# name without K=, which is the name itself where the tune named none): each shipped entry's
# launch looked up in DIR's times. Also run for session_2026-12-07e/call1_out/tables.
import os, json, glob, math, re, sys
import swapmoe
from swapmoe.tune import entry_label
Q={'bf16':None,'fp8_w8a8':'fp8_tensor','fp8_w8a8;block_shape=[128;128]':'fp8_block128'}
def heur_label(p):
    if p.backend in ('cuda_mma','cuda_wgmma'): return f"{p.backend}:t{p.tile['tokens_per_pass']}"
    return p.backend
def gm(rs): return (math.exp(sum(map(math.log,rs))/len(rs))-1)*100
allh=[];allt=[]
for f in sorted(glob.glob(sys.argv[1]+'/*.json')):
    name=os.path.basename(f)
    new=json.load(open(f)); md=new['metadata']
    old=json.load(open('python/swapmoe/tables/'+re.sub(r'K=\d+;', '', name)))
    dt=name.split('dtype=')[1][:-5]
    q=Q[dt]
    print(name.split(';device')[0], dt, '(fastest at K=%d | the %s table entry | heuristics, tables off)'%(md['K'], old['metadata']['model']))
    rh=[];rt=[]
    for m in sorted((k for k in new if k.isdigit()), key=int):
        times=new[m]['times_us']; bl=min(times,key=times.get); best=times[bl]
        os.environ['SWAPMOE_TABLES']='off'
        ph=swapmoe.select_backend(int(m), md['E'], md['topk'], md['K'], md['N'], quant=q, device_name=md['device_name'], device_capability=(9,0))
        hl=heur_label(ph); th=times.get(hl)
        tl=entry_label(old[m]); tt=times.get(tl)
        rh.append(th/best); rt.append(tt/best)
        print('  M=%-3s %-24s %6.1f | %-24s %6.1f %+5.1f%% | %-24s %6.1f %+5.1f%%' % (m, bl, best, tl, tt, (tt/best-1)*100, hl, th, (th/best-1)*100))
    print('  table: geomean %+.1f%%, %d/%d within 5%%; heuristics: geomean %+.1f%%, %d/%d within 5%%' % (gm(rt), sum(r<=1.05 for r in rt), len(rt), gm(rh), sum(r<=1.05 for r in rh), len(rh)))
    allh+=rh; allt+=rt
print('ALL: table geomean %+.1f%% %d/%d; heuristics %+.1f%% %d/%d' % (gm(allt), sum(r<=1.05 for r in allt), len(allt), gm(allh), sum(r<=1.05 for r in allh), len(allh)))
