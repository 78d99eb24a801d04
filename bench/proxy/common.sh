# What bench/proxy/run.sh, cpu.sh and ab.sh share, sourced after they set WORK (a fresh
# temporary directory) and, for start_nginx, UPSTREAM and NGINX_PROXY (free ports). A script
# adds the pid of each process it starts to PIDS, and stops everything with stop_started.

PIDS=()

# Every server a script starts (spillway, Redis; nginx daemonizes into one by itself) runs in a
# session of its own, `setsid SERVER ... &`, and the load generators stay in the script's. With
# the kernel's autogroup scheduling (/proc/sys/kernel/sched_autogroup_enabled, on in most
# distributions) each session is a scheduling group with its own share of the CPU, so a server
# left in the script's session would share one share with wrk, paced and the busy loops, while
# nginx had one of its own. In a script without job control a background job is not a process
# group leader, so setsid makes the session in place and $! stays the server's pid.

# Installs Debian package $2 when command $1 is missing.
need() {
  command -v "$1" >/dev/null 2>&1 && return
  [ -x "/usr/sbin/$1" ] && return
  echo "installing $2 from Debian" >&2
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >&2
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

nginx_conf() { # $1: name, $2: workers, $3: the http block's servers
  mkdir -p "$WORK/$1"
  cat > "$WORK/$1.conf" <<CONF
worker_processes $2;
pid $WORK/$1.pid;
error_log $WORK/$1/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 100000000;
  client_body_temp_path $WORK/$1; proxy_temp_path $WORK/$1;
  fastcgi_temp_path $WORK/$1; uwsgi_temp_path $WORK/$1; scgi_temp_path $WORK/$1;
$3
}
CONF
  "$(command -v nginx || echo /usr/sbin/nginx)" -c "$WORK/$1.conf" -p "$WORK/$1"
}

# Two nginx instances: the upstream (one worker, answering 200 from memory), and the limit_req
# reverse proxy in front of it, a process of its own with NGINX_WORKERS workers (default 2, as
# many as spillway's serving threads), so each proxy has the same cores and the same one
# upstream worker behind it.
start_nginx() {
  nginx_conf upstream 1 "  server { listen 127.0.0.1:$UPSTREAM; location / { return 200 \"ok\\n\"; } }"
  nginx_conf proxy "${NGINX_WORKERS:-2}" "  limit_req_zone \$binary_remote_addr zone=bench:1m rate=10000000r/s;
  upstream backend { server 127.0.0.1:$UPSTREAM; keepalive 64; }
  server {
    listen 127.0.0.1:$NGINX_PROXY;
    location / {
      limit_req zone=bench burst=1000000 nodelay;
      proxy_http_version 1.1;
      proxy_set_header Connection \"\";
      proxy_pass http://backend;
    }
  }"
}

# Stops both nginx and waits for them to exit (at most 5 s each), since nginx writes into WORK
# until it has: then WORK can be removed.
stop_nginx() {
  local pidfile pid
  for pidfile in "$WORK/upstream.pid" "$WORK/proxy.pid"; do
    [ -f "$pidfile" ] && pid=$(cat "$pidfile") && kill "$pid" 2>/dev/null || continue
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  done
}

# Waits (at most 5 s) until something listens on $1:$2, or exits saying what is missing.
wait_port() {
  for _ in $(seq 50); do (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null && return; sleep 0.1; done
  echo "nothing listens on $1:$2" >&2; exit 1
}

# Stops the processes in PIDS and both nginx, then removes WORK: for a script's EXIT trap.
stop_started() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  stop_nginx
  rm -rf "$WORK" 2>/dev/null || true
}
