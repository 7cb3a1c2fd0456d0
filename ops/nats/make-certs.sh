#!/bin/sh
# make-certs.sh DIR [HOSTNAME...]: a private CA and one server certificate for the NATS servers.
#
# For trying the production shape (docker compose, the tests) without a PKI of your own: the
# certificate names every HOSTNAME (default nats-1 nats-2 nats-3 localhost) and 127.0.0.1, and may
# be used as a server and as a client certificate, so the three servers also authenticate each other
# on their cluster routes (mutual TLS). In a real deployment use your own CA and one key per server.
#
# Writes DIR/ca.pem (public), DIR/ca-key.pem, DIR/server.pem, DIR/server-key.pem (0600).
# Leaves existing certificates alone, so a restarted compose project keeps its CA.
set -eu
dir=${1:?usage: make-certs.sh DIR [HOSTNAME...]}
shift
[ $# -gt 0 ] || set -- nats-1 nats-2 nats-3 localhost
if [ -s "$dir/server.pem" ] && [ -s "$dir/server-key.pem" ] && [ -s "$dir/ca.pem" ]; then
  echo "make-certs: certificates exist in $dir; keeping them"
  exit 0
fi
mkdir -p "$dir"
umask 077
san="IP:127.0.0.1"
for host in "$@"; do san="$san,DNS:$host"; done

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 825 \
  -subj "/CN=scheduler-gateway NATS CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -keyout "$dir/ca-key.pem" -out "$dir/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$1" \
  -keyout "$dir/server-key.pem" -out "$dir/server.csr" 2>/dev/null
cat > "$dir/server.ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$san
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid,issuer
EXT
openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca-key.pem" -CAcreateserial \
  -days 825 -extfile "$dir/server.ext" -out "$dir/server.pem" 2>/dev/null
rm -f "$dir/server.csr" "$dir/server.ext" "$dir/ca.srl"
chmod 0644 "$dir/ca.pem" "$dir/server.pem"
echo "make-certs: wrote a CA and a server certificate for $* to $dir"
