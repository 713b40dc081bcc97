#!/usr/bin/env bash
# Seeds for the `--key` parser fuzz target (crates/ota/fuzz, `keys`) in DIR: RSA-2048 and EC
# P-256 keys that openssl makes here, each as a self-signed certificate and a public key, PEM
# and DER, the RSA key also as PKCS#1 "RSA PUBLIC KEY", an Ed25519 certificate (refused), and
# a zip of the two certificates (as otacerts.zip).
# usage: tests/lib/key-seeds.sh DIR
set -euo pipefail
dir=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for spec in rsa:RSA:rsa_keygen_bits:2048 ec:EC:ec_paramgen_curve:P-256 ed:ED25519; do
  IFS=: read -r name alg opt val <<< "$spec"
  if [ -n "${opt:-}" ]; then
    openssl genpkey -algorithm "$alg" -pkeyopt "$opt:$val" -out "$tmp/$name.key" 2> /dev/null
  else
    openssl genpkey -algorithm "$alg" -out "$tmp/$name.key" 2> /dev/null
  fi
  openssl req -x509 -new -key "$tmp/$name.key" -subj "/CN=seed $name" -days 2 -out "$dir/$name.crt.pem"
  openssl x509 -in "$dir/$name.crt.pem" -outform DER -out "$dir/$name.crt.der"
  openssl pkey -in "$tmp/$name.key" -pubout -out "$dir/$name.pub.pem"
  openssl pkey -in "$tmp/$name.key" -pubout -outform DER -out "$dir/$name.pub.der"
done
openssl rsa -in "$tmp/rsa.key" -RSAPublicKey_out -out "$dir/rsa.pkcs1.pem" 2> /dev/null
zip -j -q "$tmp/otacerts.zip" "$dir/rsa.crt.pem" "$dir/ec.crt.pem"
cp "$tmp/otacerts.zip" "$dir/otacerts.zip"
