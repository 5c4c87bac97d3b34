#!/usr/bin/env bash
# Writes the certificates security_test.py needs into OUTDIR (created if
# missing), with the openssl command-line tool and EC P-256 keys (fast):
#
#   ca.pem, ca.key             the test CA the daemon trusts for clients
#   server.pem, server.key     the daemon's certificate: SANs localhost, 127.0.0.1
#   server-next.pem            a second server certificate from the same CA and
#                              key (another serial), for certificate rotation
#   server-rekeyed.pem/.key    a third one with a new key
#   ops.pem, ops.key           client: ops.kvcache.test (SAN)
#   acme-worker.pem/.key       client: acme-worker.kvcache.test (SAN)
#   cn-only.pem/.key           client: CN cn-only.kvcache.test, no SAN
#   stranger.pem/.key          client: stranger.kvcache.test, signed by the CA
#                              but named by no principal
#   expired.pem/.key           client: ops.kvcache.test, signed by the CA,
#                              valid only in January 2020
#   rogue.pem/.key             client: ops.kvcache.test, signed by a second CA
#                              (rogue-ca.pem) the daemon does not trust
#
# Usage: make_test_certs.sh OUTDIR
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
command -v openssl >/dev/null || {
  echo "make_test_certs.sh: needs the openssl command (Debian package openssl)" >&2
  exit 1
}
out=$1
mkdir -p "$out"
cd "$out"
export KVCACHE_CERT_NAME=unused  # client_ext's SAN, set per certificate below

# One configuration for the CAs' databases (openssl ca is the only way
# OpenSSL 3.0 issues a certificate with a start date in the past) and for the
# extensions of each kind of certificate.
cat >openssl.cnf <<'EOF'
[ ca ]
default_ca = test_ca

[ test_ca ]
dir = ./db
database = $dir/index.txt
new_certs_dir = $dir/new
serial = $dir/serial
default_md = sha256
default_days = 30
policy = any_name
unique_subject = no
copy_extensions = none

[ rogue_ca ]
dir = ./rogue-db
database = $dir/index.txt
new_certs_dir = $dir/new
serial = $dir/serial
default_md = sha256
default_days = 30
policy = any_name
unique_subject = no
copy_extensions = none

[ any_name ]
commonName = supplied

[ req ]
distinguished_name = req_dn
prompt = no

[ req_dn ]
CN = unused

[ ca_ext ]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash

[ server_ext ]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1

[ client_ext ]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectAltName = DNS:${ENV::KVCACHE_CERT_NAME}

[ client_cn_only_ext ]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
EOF

for db in db rogue-db; do
  rm -rf "$db"
  mkdir -p "$db/new"
  : >"$db/index.txt"
  openssl rand -hex 8 >"$db/serial"
done

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

# A self-signed CA: make_ca NAME CN
make_ca() {
  key "$1.key"
  openssl req -config openssl.cnf -new -x509 -key "$1.key" -subj "/CN=$2" -days 30 \
    -extensions ca_ext -out "$1.pem"
}

# issue CA_SECTION CA_NAME OUT CN EXTENSIONS [KEY] [openssl ca options...]
issue() {
  local section=$1 ca=$2 name=$3 cn=$4 ext=$5 keyfile=$6
  shift 6
  [[ -f $keyfile ]] || key "$keyfile"
  openssl req -config openssl.cnf -new -key "$keyfile" -subj "/CN=$cn" -out "$name.csr"
  KVCACHE_CERT_NAME=$cn openssl ca -batch -notext -config openssl.cnf -name "$section" \
    -cert "$ca.pem" -keyfile "$ca.key" -extensions "$ext" -in "$name.csr" -out "$name.pem" \
    "$@" 2>/dev/null
  rm -f "$name.csr"
}

make_ca ca "kvcached test CA"
make_ca rogue-ca "kvcached rogue test CA"
issue test_ca ca server localhost server_ext server.key
issue test_ca ca server-next localhost server_ext server.key
issue test_ca ca server-rekeyed localhost server_ext server-rekeyed.key
issue test_ca ca ops ops.kvcache.test client_ext ops.key
issue test_ca ca acme-worker acme-worker.kvcache.test client_ext acme-worker.key
issue test_ca ca cn-only cn-only.kvcache.test client_cn_only_ext cn-only.key
issue test_ca ca stranger stranger.kvcache.test client_ext stranger.key
issue test_ca ca expired ops.kvcache.test client_ext expired.key \
  -startdate 20200101000000Z -enddate 20200131000000Z
issue rogue_ca rogue-ca rogue ops.kvcache.test client_ext rogue.key

# What the test relies on, checked here so a wrong certificate fails loudly.
openssl verify -CAfile ca.pem server.pem server-next.pem server-rekeyed.pem ops.pem acme-worker.pem cn-only.pem \
  stranger.pem >/dev/null
if openssl verify -CAfile ca.pem expired.pem >/dev/null 2>&1; then
  echo "make_test_certs.sh: expired.pem verifies; it must not" >&2
  exit 1
fi
if openssl verify -CAfile ca.pem rogue.pem >/dev/null 2>&1; then
  echo "make_test_certs.sh: rogue.pem verifies against ca.pem; it must not" >&2
  exit 1
fi
openssl verify -CAfile rogue-ca.pem rogue.pem >/dev/null
chmod 600 ./*.key
