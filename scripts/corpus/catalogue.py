"""The secret types planted in the corpus, one small builder per provider format.

Each builder returns a `Plant` (see formats.py). The format notes say where the shape comes
from; where a provider only documents "a 32-character key", the secret is planted next to
the name such keys are conventionally assigned to (needs_name=True).
"""
import base64

from formats import (ALNUM, B64, B64URL, BASE32, BCRYPT, BECH32, HEX, LOWER_ALNUM, UPPER_ALNUM,
                     Plant, checksummed, jwt, pem, PEM_KINDS)


def v(family, rule_id, name, value, needs_name=False, **kw):
    return Plant(family, rule_id, name.split(), [(value, True)], needs_name=needs_name, **kw)


def url(family, rule_id, name, before, secret, after):
    return Plant(family, rule_id, name.split(), [(before, False), (secret, True), (after, False)], kind="url")


# --- cloud -------------------------------------------------------------------------------
def aws_key_id(g):
    return v("cloud", "aws-access-key-id", "aws access key id", g.r.choice(["AKIA", "ASIA"]) + g.s(BASE32, 16))


def aws_secret(g):
    return v("cloud", "aws-secret-access-key", "aws secret access key", g.mixed(B64, 40), needs_name=True)


def aws_session(g):
    # STS session tokens are base64 of a binary blob starting "\x27\x2a\x09origin_ec" etc.
    return v("cloud", "aws-session-token", "aws session token", "IQoJb3JpZ2luX2Vj" + g.b64(g.r.randint(200, 400)).rstrip("="))


def gcp_client_secret(g):
    return v("cloud", "gcp-oauth-client-secret", "google client secret", "GOCSPX-" + g.mixed(B64URL, 28))


def google_access_token(g):
    return v("cloud", "google-oauth-access-token", "google access token", "ya29.a0" + g.mixed(B64URL, g.r.randint(120, 200)))


def azure_conn(g):
    acct = g.r.choice(["prodlogs", "mediastore", "backupsweu", "datalake01"])
    key = g.b64(64)  # 64 random bytes -> 86 chars + "=="
    return url("cloud", "azure-storage-account-key", "azure storage connection string",
               f"DefaultEndpointsProtocol=https;AccountName={acct};AccountKey=", key, ";EndpointSuffix=core.windows.net")


def azure_client_secret(g):
    return v("cloud", "azure-ad-client-secret", "azure client secret",
             g.s(ALNUM, 3) + g.r.choice("5678") + "Q~" + g.mixed(ALNUM + "_~.-", 34).replace("--", "-a"))


def azure_sas(g):
    sig = g.b64(32).replace("+", "%2B").replace("/", "%2F").replace("=", "%3D")
    return url("cloud", "azure-sas-token", "azure blob sas url",
               f"https://{g.r.choice(['acct', 'media', 'logs'])}{g.s(LOWER_ALNUM, 4)}.blob.core.windows.net/exports/report.csv"
               "?sv=2022-11-02&ss=b&srt=o&sp=r&se=2031-01-01T00:00:00Z&spr=https&sig=", sig, "")


def alibaba(g):
    return v("cloud", "alibaba-access-key-id", "alibaba cloud access key id", "LTAI5t" + g.mixed(ALNUM, 18))


def digitalocean(g):
    return v("cloud", "digitalocean-pat", "digitalocean token", "dop_v1_" + g.s(HEX, 64))


def cloudflare_token(g):
    return v("cloud", "cloudflare-api-token", "cloudflare api token", g.mixed(B64URL, 40), needs_name=True)


def heroku(g):
    return v("cloud", "heroku-api-key", "heroku api key", "HRKU-AA" + g.mixed(B64URL, 58))


def vault(g):
    return v("cloud", "hashicorp-vault-token", "vault token", "hvs.CAESI" + g.mixed(B64URL, 86))


def terraform(g):
    return v("cloud", "terraform-cloud-token", "tfe token", g.mixed(ALNUM, 14) + ".atlasv1." + g.mixed(ALNUM, 67))


def doppler(g):
    return v("cloud", "doppler-token", "doppler token", "dp.st." + g.r.choice(["prd", "stg", "dev"]) + "." + g.mixed(ALNUM, 40))


def databricks(g):
    return v("cloud", "databricks-token", "databricks token", "dapi" + g.s(HEX, 32))


def kubeconfig(g):
    inner = "-----BEGIN RSA PRIVATE KEY-----\n" + g.b64(600) + "\n-----END RSA PRIVATE KEY-----\n"
    return v("cloud", "kubeconfig-client-key", "client key data", base64.b64encode(inner.encode()).decode(), kind="kubeconfig")


# --- code hosting --------------------------------------------------------------------------
def github(g):
    pre = g.r.choice(["ghp_", "ghp_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_"])
    rid = {"ghp_": "github-pat-classic", "gho_": "github-oauth-token", "ghu_": "github-user-to-server-token",
           "ghs_": "github-app-installation-token", "ghr_": "github-refresh-token"}[pre]
    return v("code-hosting", rid, "github token", checksummed(g, pre, 30))


def github_fine(g):
    return v("code-hosting", "github-fine-grained-pat", "github pat", "github_pat_" + g.mixed(ALNUM, 22) + "_" + g.mixed(ALNUM, 59))


def gitlab(g):
    pre, rid = g.r.choice([("glpat-", "gitlab-pat"), ("glpat-", "gitlab-pat"), ("gldt-", "gitlab-deploy-token"),
                           ("glrt-", "gitlab-runner-token"), ("glcbt-", "gitlab-ci-job-token"), ("gloas-", "gitlab-oauth-app-secret")])
    return v("code-hosting", rid, "gitlab token", pre + g.mixed(B64URL.replace("-", ""), 20))


def npm(g):
    return v("code-hosting", "npm-access-token", "npm token", checksummed(g, "npm_", 30))


def pypi(g):
    # "pypi-" + base64url macaroon; its first bytes encode the location "pypi.org".
    return v("code-hosting", "pypi-upload-token", "twine password", "pypi-AgEIcHlwaS5vcmc" + g.b64(g.r.randint(110, 160), url=True).rstrip("="))


def dockerhub(g):
    return v("code-hosting", "dockerhub-token", "docker hub token", "dckr_pat_" + g.mixed(B64URL, 27))


def rubygems(g):
    return v("code-hosting", "rubygems-api-key", "gem host api key", "rubygems_" + g.s(HEX, 48))


def nuget(g):
    return v("code-hosting", "nuget-api-key", "nuget api key", "oy2" + g.mixed(LOWER_ALNUM, 43))


def sonar(g):
    return v("code-hosting", "sonarqube-token", "sonar token", g.r.choice(["squ_", "sqp_", "sqa_"]) + g.s(HEX, 40))


def jfrog(g):
    return v("code-hosting", "jfrog-api-key", "artifactory api key", "AKCp8" + g.mixed(ALNUM, 68))


# --- payment -------------------------------------------------------------------------------
def stripe(g):
    pre, rid = g.r.choice([("sk_live_", "stripe-secret-key"), ("sk_live_", "stripe-secret-key"), ("rk_live_", "stripe-restricted-key")])
    body = g.r.choice([g.mixed(ALNUM, 24), "51" + g.mixed(ALNUM, 97)])
    return v("payment", rid, "stripe secret key", pre + body)


def stripe_webhook(g):
    return v("payment", "stripe-webhook-secret", "stripe webhook secret", "whsec_" + g.mixed(ALNUM, 32))


def square(g):
    return v("payment", "square-access-token", "square access token", "EAAA" + g.mixed(B64URL, 60))


def braintree(g):
    return v("payment", "braintree-access-token", "braintree access token",
             "access_token$production$" + g.s(LOWER_ALNUM, 16) + "$" + g.s(HEX, 32))


def shopify(g):
    pre, rid = g.r.choice([("shpat_", "shopify-access-token"), ("shpss_", "shopify-shared-secret"), ("shpca_", "shopify-custom-app-token")])
    return v("payment", rid, "shopify token", pre + g.s(HEX, 32))


def razorpay(g):
    return v("payment", "razorpay-key-secret", "razorpay key secret", g.mixed(ALNUM, 24), needs_name=True)


# --- messaging -----------------------------------------------------------------------------
def slack(g):
    d = lambda n: str(g.r.randint(10 ** (n - 1), 10 ** n - 1))
    kind = g.r.choice(["b", "b", "p"])
    if kind == "b":
        return v("messaging", "slack-bot-token", "slack bot token", f"xoxb-{d(12)}-{d(13)}-{g.mixed(ALNUM, 24)}")
    return v("messaging", "slack-user-token", "slack user token", f"xoxp-{d(12)}-{d(12)}-{d(13)}-{g.s(HEX, 32)}")


def slack_webhook(g):
    return url("messaging", "slack-webhook-url", "slack webhook url", "https://hooks.slack.com/",
               f"services/T{g.s(UPPER_ALNUM, 10)}/B{g.s(UPPER_ALNUM, 10)}/{g.mixed(ALNUM, 24)}", "")


def discord(g):
    uid = str(g.r.randint(10 ** 17, 2 * 10 ** 18))
    first = base64.b64encode(uid.encode()).decode().rstrip("=")
    return v("messaging", "discord-bot-token", "discord bot token", f"{first}.{g.mixed(B64URL, 6)}.{g.mixed(B64URL, 38)}", needs_name=True)


def discord_webhook(g):
    return url("messaging", "discord-webhook-url", "discord webhook", "https://discord.com/api/webhooks/",
               f"{g.r.randint(10 ** 17, 2 * 10 ** 18)}/{g.mixed(B64URL, 68)}", "")


def telegram(g):
    return v("messaging", "telegram-bot-token", "telegram bot token", f"{g.r.randint(10 ** 8, 8 * 10 ** 9)}:AA{g.mixed(B64URL, 33)}")


def twilio(g):
    if g.r.random() < 0.5:
        # An API key SID is only a secret-shaped identifier without its name.
        return v("messaging", "twilio-api-key", "twilio api key", "SK" + g.s(HEX, 32), needs_name=True)
    return v("messaging", "twilio-auth-token", "twilio auth token", g.s(HEX, 32), needs_name=True)


def sendgrid(g):
    return v("messaging", "sendgrid-api-key", "sendgrid api key", f"SG.{g.mixed(B64URL, 22)}.{g.mixed(B64URL, 43)}")


def mailgun(g):
    return v("messaging", "mailgun-api-key", "mailgun api key", "key-" + g.s(HEX, 32))


def mailchimp(g):
    return v("messaging", "mailchimp-api-key", "mailchimp api key", f"{g.s(HEX, 32)}-us{g.r.randint(1, 21)}")


def brevo(g):
    return v("messaging", "brevo-api-key", "brevo api key", f"xkeysib-{g.s(HEX, 64)}-{g.mixed(ALNUM, 16)}")


# --- AI providers --------------------------------------------------------------------------
def openai(g):
    pre, rid = g.r.choice([("sk-proj-", "openai-project-key")] * 3 + [("sk-svcacct-", "openai-service-account-key"), ("sk-admin-", "openai-admin-key")])
    return v("ai-providers", rid, "openai api key", pre + g.mixed(B64URL, 74) + "T3BlbkFJ" + g.mixed(B64URL, 74))


def openai_legacy(g):
    return v("ai-providers", "openai-legacy-key", "openai api key", "sk-" + g.mixed(ALNUM, 20) + "T3BlbkFJ" + g.mixed(ALNUM, 20))


def anthropic(g):
    return v("ai-providers", "anthropic-api-key", "anthropic api key", "sk-ant-api03-" + g.mixed(B64URL, 93) + "AA")


def google_ai(g):
    return v("ai-providers", "google-api-key", "gemini api key", "AIzaSy" + g.mixed(B64URL, 33))


def huggingface(g):
    return v("ai-providers", "huggingface-token", "hf token", "hf_" + g.s(ALNUM[:52], 34))


def replicate(g):
    return v("ai-providers", "replicate-api-token", "replicate api token", "r8_" + g.mixed(ALNUM, 37))


def groq(g):
    return v("ai-providers", "groq-api-key", "groq api key", "gsk_" + g.mixed(ALNUM, 52))


def perplexity(g):
    return v("ai-providers", "perplexity-api-key", "perplexity api key", "pplx-" + g.mixed(ALNUM, 48))


def xai(g):
    return v("ai-providers", "xai-api-key", "xai api key", "xai-" + g.mixed(ALNUM, 80))


def openrouter(g):
    return v("ai-providers", "openrouter-api-key", "openrouter api key", "sk-or-v1-" + g.s(HEX, 64))


def mistral(g):
    return v("ai-providers", "mistral-api-key", "mistral api key", g.mixed(ALNUM, 32), needs_name=True)


def cohere(g):
    return v("ai-providers", "cohere-api-key", "cohere api key", g.mixed(ALNUM, 40), needs_name=True)


# --- databases -----------------------------------------------------------------------------
def db_url(g):
    scheme, rid, port = g.r.choice([("postgres", "postgres-url-password", 5432), ("postgresql", "postgres-url-password", 5432),
                                    ("mysql", "mysql-url-password", 3306), ("mongodb+srv", "mongodb-url-password", None),
                                    ("mongodb", "mongodb-url-password", 27017), ("redis", "redis-url-password", 6379),
                                    ("rediss", "redis-url-password", 6380), ("amqp", "amqp-url-password", 5672)])
    user = g.r.choice(["app", "svc_orders", "admin", "etl", "default", "reporting"])
    host = g.r.choice(["db.internal", "10.0.3.17", "pg-primary.prod.svc", "cluster0.x7k2p.mongodb.net", "cache-01.internal", "mq.internal"])
    tail = f":{port}/{g.r.choice(['app', 'orders', 'analytics', '0'])}" if port else "/prod?retryWrites=true&w=majority"
    return url("databases", rid, "database url", f"{scheme}://{user}:", g.password(url_safe=True), f"@{host}{tail}")


def jdbc(g):
    return url("databases", "jdbc-url-password", "jdbc url",
               f"jdbc:sqlserver://sql{g.r.randint(1, 9)}.internal:1433;databaseName=hr;user=svc_hr;password=", g.password(url_safe=True), ";encrypt=true")


def ado(g):
    return url("databases", "ado-connection-string-password", "connection string",
               f"Server=tcp:sql.internal,1433;Initial Catalog=crm;User ID=app;Password=", g.password(url_safe=True), ";Encrypt=True;")


# --- private keys, tokens ------------------------------------------------------------------
def private_key(g):
    return pem(g, g.r.choice(list(PEM_KINDS)))


def age(g):
    return v("private-keys", "age-secret-key", "age key", "AGE-SECRET-KEY-1" + g.s(BECH32, 58).upper())


def wireguard(g):
    return v("private-keys", "wireguard-private-key", "private key", g.b64(32), kind="wireguard")


def a_jwt(g):
    return v("tokens-jwt", "jwt", "id token", jwt(g, g.r.choice(["HS256", "RS256", "ES256"]), g.r.choice([32, 64, 256])))


# --- generic -------------------------------------------------------------------------------
PW_NAMES = ["db password", "password", "smtp password", "admin password", "redis password", "db pass", "mail pass", "ldap bind password", "keystore password"]
KEY_NAMES = ["api key", "client secret", "secret key", "app secret", "internal api key", "signing key", "webhook secret", "encryption key", "service api key"]
TOKEN_NAMES = ["access token", "auth token", "api token", "refresh token", "session token", "bearer token"]


def generic_password(g):
    p = Plant("generic", "generic-password", g.r.choice(PW_NAMES).split(), [(g.password(), True)], needs_name=True)
    return p


def generic_key(g):
    val = g.r.choice([g.mixed(ALNUM, 32), g.s(HEX, 40), g.mixed(B64URL, 43), g.uuid4()])
    return Plant("generic", "generic-api-key", g.r.choice(KEY_NAMES).split(), [(val, True)], needs_name=True)


def generic_token(g):
    return Plant("generic", "generic-token", g.r.choice(TOKEN_NAMES).split(), [(g.mixed(B64URL, g.r.choice([32, 40, 64])), True)], needs_name=True)


def basic_auth_url(g):
    host = g.r.choice(["git.internal/team/app.git", "proxy.corp:3128", "files.internal/dumps", "nexus.internal/repository/maven"])
    scheme = g.r.choice(["https", "https", "http", "ftp"])
    return url("generic", "basic-auth-url", "remote url", f"{scheme}://{g.r.choice(['deploy', 'ci', 'backup', 'svc'])}:", g.password(url_safe=True), f"@{host}")


def bearer(g):
    return Plant("generic", "authorization-bearer", ["authorization"], [(g.mixed(B64URL + ".", g.r.choice([40, 64])), True)], kind="header")


def basic_header(g):
    cred = base64.b64encode(f"{g.r.choice(['svc', 'admin', 'deploy'])}:{g.password()}".encode()).decode()
    return Plant("generic", "authorization-basic", ["authorization"], [(cred, True)], kind="basic")


def api_key_header(g):
    return Plant("generic", "api-key-header", ["x api key"], [(g.mixed(ALNUM, 32), True)], kind="xapikey")


def cli_password(g):
    return Plant("generic", "cli-password-flag", ["cli"], [(g.password(url_safe=True), True)], kind="cli")


def bcrypt(g):
    return v("generic", "password-hash", "password hash", f"$2b$12${g.s(BCRYPT, 53)}", kind="hash")


# (weight, builder): weights roughly follow how often each kind shows up in real leaks.
CATALOGUE = [
    (5, aws_key_id), (4, aws_secret), (1, aws_session), (1, gcp_client_secret), (1, google_access_token), (2, azure_conn),
    (1, azure_client_secret), (1, azure_sas), (1, alibaba), (1, digitalocean), (1, cloudflare_token), (1, heroku), (1, vault),
    (1, terraform), (1, doppler), (1, databricks), (1, kubeconfig),
    (6, github), (2, github_fine), (3, gitlab), (2, npm), (1, pypi), (1, dockerhub), (1, rubygems), (1, nuget), (1, sonar), (1, jfrog),
    (4, stripe), (1, stripe_webhook), (1, square), (1, braintree), (1, shopify), (1, razorpay),
    (3, slack), (2, slack_webhook), (1, discord), (1, discord_webhook), (2, telegram), (2, twilio), (2, sendgrid), (1, mailgun),
    (1, mailchimp), (1, brevo),
    (6, openai), (1, openai_legacy), (4, anthropic), (3, google_ai), (2, huggingface), (1, replicate), (1, groq), (1, perplexity),
    (1, xai), (1, openrouter), (1, mistral), (1, cohere),
    (6, db_url), (1, jdbc), (1, ado),
    (5, private_key), (1, age), (1, wireguard), (4, a_jwt),
    (6, generic_password), (5, generic_key), (3, generic_token), (3, basic_auth_url), (4, bearer), (1, basic_header),
    (1, api_key_header), (2, cli_password), (1, bcrypt),
]


def pick(g):
    total = sum(w for w, _ in CATALOGUE)
    x = g.r.uniform(0, total)
    for w, f in CATALOGUE:
        x -= w
        if x <= 0:
            return f(g)
    return CATALOGUE[-1][1](g)
