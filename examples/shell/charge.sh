#!/bin/sh
# charge.sh LEDGER_URL CUSTOMER AMOUNT: charge one customer through the
# fenced ledger, with the fencing token that `kubectl dlock run` exported.
# Run it as the lock's holder:
#
#   kubectl dlock run billing -- ./charge.sh http://127.0.0.1:8080 customer-42 1299
#
# Any language works the same way: read $FENCING_TOKEN, send it with every
# write (here in the X-Fencing-Token header that frontdesk's fencing
# middleware reads), and take a refusal to mean that a newer holder has
# written: stop, do not retry.
set -eu

if [ -z "${FENCING_TOKEN:-}" ]; then
	echo "charge.sh: FENCING_TOKEN is not set: run me under kubectl dlock run" >&2
	exit 64
fi
if [ $# -ne 3 ]; then
	echo "usage: charge.sh LEDGER_URL CUSTOMER AMOUNT" >&2
	exit 64
fi
url=$1 customer=$2 amount=$3

body=$(mktemp)
trap 'rm -f "$body"' EXIT
code=$(curl -sS -o "$body" -w '%{http_code}' -X POST \
	-H "X-Fencing-Token: $FENCING_TOKEN" \
	--data-urlencode "customer=$customer" --data-urlencode "amount=$amount" \
	"$url/charges")
case $code in
2??)
	cat "$body"
	;;
409)
	echo "charge.sh: the ledger refused fencing token $FENCING_TOKEN of lock ${LOCK_NAME:-?}: a newer holder has written; stopping: $(cat "$body")" >&2
	exit 75
	;;
*)
	echo "charge.sh: the ledger answered $code: $(cat "$body")" >&2
	exit 1
	;;
esac
